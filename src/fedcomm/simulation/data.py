"""Pre-tensorised client data: every client's train and test split as ready tensors.

Built once per run from a dataset and its partition (no DataLoader per client): a client's
local training indexes its own tensors directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from fedcomm.algorithms.base import ClientData
from fedcomm.data.types import Dataset


@dataclass(frozen=True)
class FederatedTensors:
    """``train[c]``/``test[c]``: client ``c``'s splits; ``global_test``: their union."""

    train: tuple[ClientData, ...]
    test: tuple[ClientData, ...]
    global_test: ClientData
    num_classes: int
    input_shape: tuple[int, ...]

    @property
    def num_clients(self) -> int:
        return len(self.train)

    @classmethod
    def build(
        cls, dataset: Dataset, train: Sequence[np.ndarray], test: Sequence[np.ndarray]
    ) -> FederatedTensors:
        x = torch.from_numpy(np.ascontiguousarray(dataset.x))
        y = torch.from_numpy(np.ascontiguousarray(dataset.y)).long()

        def take(rows: np.ndarray) -> ClientData:
            idx = torch.from_numpy(np.array(rows, dtype=np.int64))
            return ClientData(x.index_select(0, idx), y.index_select(0, idx))

        tests = tuple(take(r) for r in test)
        all_test = (
            np.concatenate([np.asarray(r, dtype=np.int64) for r in test])
            if test
            else np.zeros(0, np.int64)
        )
        return cls(
            train=tuple(take(r) for r in train),
            test=tests,
            global_test=take(all_test),
            num_classes=dataset.num_classes,
            input_shape=dataset.input_shape,
        )

    def to(self, device: torch.device) -> FederatedTensors:
        """Every split on ``device`` (once per run; ``self`` when already there)."""
        if self.global_test.x.device == device:
            return self

        def move(d: ClientData) -> ClientData:
            return ClientData(d.x.to(device), d.y.to(device))

        return replace(
            self,
            train=tuple(move(d) for d in self.train),
            test=tuple(move(d) for d in self.test),
            global_test=move(self.global_test),
        )
