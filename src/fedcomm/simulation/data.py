"""Pre-tensorised client data: every client's train split as ready tensors, the test splits as
rows of one pool of distinct test examples.

Built once per run from a dataset and its partition (no DataLoader per client): a client's
local training indexes its own tensors directly. Test rows shared between clients (``lotteryfl``
gives every client holding a class the same rows) are stored once: the pool holds at most the
dataset, whatever the number of clients (:class:`~fedcomm.data.federated.RowPool`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import overload

import numpy as np
import torch
from torch import Tensor

from fedcomm.algorithms.core import ClientData
from fedcomm.data.federated import RowPool
from fedcomm.data.types import Dataset


class PooledSplits(Sequence[ClientData]):
    """Client splits as index sets into one pool: split ``c`` is ``pool[rows[c]]``.

    A split is gathered when it is asked for (a copy of its examples, one client at a time),
    never all of them at once; :func:`fedcomm.simulation.global_eval.evaluate_global` reads
    :attr:`pool` and :attr:`rows` directly instead.
    """

    def __init__(self, pool: ClientData, rows: Sequence[Tensor]) -> None:
        self.pool = pool
        self.rows = tuple(rows)  # per client, (n_c,) int64 on the pool's device

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> ClientData: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[ClientData]: ...

    def __getitem__(self, index: int | slice) -> ClientData | Sequence[ClientData]:
        if isinstance(index, slice):
            return PooledSplits(self.pool, self.rows[index])
        rows = self.rows[index]
        return ClientData(self.pool.x.index_select(0, rows), self.pool.y.index_select(0, rows))

    def __iter__(self) -> Iterator[ClientData]:
        return (self[c] for c in range(len(self)))

    def sizes(self) -> list[int]:
        """Examples per split, without gathering any."""
        return [len(r) for r in self.rows]

    def on(self, pool: ClientData) -> PooledSplits:
        """The same splits over ``pool`` (this pool moved to another device)."""
        return PooledSplits(pool, [r.to(pool.x.device) for r in self.rows])


@dataclass(frozen=True)
class FederatedTensors:
    """``train[c]``/``test[c]``: client ``c``'s splits; ``global_test``: the test examples the
    global model is evaluated on.

    Built by :meth:`build`, ``test`` is a :class:`PooledSplits` over ``global_test``: the pool of
    distinct test examples, and ``union_rows`` lists the union of the clients' splits (in client
    order, a row shared by clients once per client) as pool indices, or is ``None`` when no row
    is shared and the pool is that union itself. Built directly, ``test`` may be any splits and
    ``global_test`` their union, with ``union_rows`` left ``None``.
    """

    train: tuple[ClientData, ...]
    test: Sequence[ClientData]
    global_test: ClientData
    num_classes: int
    input_shape: tuple[int, ...]
    union_rows: Tensor | None = None  # (sum n_c,) int64 indices into global_test

    def __post_init__(self) -> None:
        if self.union_rows is not None and not (
            isinstance(self.test, PooledSplits) and self.test.pool is self.global_test
        ):
            raise ValueError("union_rows index the pool of pooled test splits (see build)")

    @property
    def num_clients(self) -> int:
        return len(self.train)

    @property
    def union_size(self) -> int:
        """Test examples of the union of the clients' splits, duplicates counted."""
        rows = self.union_rows
        return self.global_test.num_examples if rows is None else len(rows)

    @classmethod
    def build(
        cls, dataset: Dataset, train: Sequence[np.ndarray], test: Sequence[np.ndarray]
    ) -> FederatedTensors:
        x = torch.from_numpy(np.ascontiguousarray(dataset.x))
        y = torch.from_numpy(np.ascontiguousarray(dataset.y)).long()

        def take(rows: np.ndarray) -> ClientData:
            idx = torch.from_numpy(np.array(rows, dtype=np.int64))
            return ClientData(x.index_select(0, idx), y.index_select(0, idx))

        pool = RowPool.of(list(test))
        examples = take(pool.rows)
        index = [torch.from_numpy(np.array(r, dtype=np.int64)) for r in pool.clients]
        union = None if pool.union is None else torch.from_numpy(np.array(pool.union))
        return cls(
            train=tuple(take(r) for r in train),
            test=PooledSplits(examples, index),
            global_test=examples,
            num_classes=dataset.num_classes,
            input_shape=dataset.input_shape,
            union_rows=union,
        )

    def to(self, device: torch.device) -> FederatedTensors:
        """Every split on ``device`` (once per run; ``self`` when already there)."""
        if self.global_test.x.device == device:
            return self

        def move(d: ClientData) -> ClientData:
            return ClientData(d.x.to(device), d.y.to(device))

        pool = move(self.global_test)
        test = self.test
        if isinstance(test, PooledSplits):
            test = test.on(pool if test.pool is self.global_test else move(test.pool))
        else:
            test = tuple(move(d) for d in test)
        return replace(
            self,
            train=tuple(move(d) for d in self.train),
            test=test,
            global_test=pool,
            union_rows=None if self.union_rows is None else self.union_rows.to(device),
        )
