"""The federated view of a dataset: which rows each client holds, for train and for test.

A :class:`Partition` is built from a :class:`~fedcomm.data.types.Dataset` and a
:class:`PartitionSpec` by :func:`make_partition`. The partition hash (sha256 of the dataset
fingerprint and the canonical spec, :func:`partition_hash`) is the cache key of the stored
partition (:mod:`fedcomm.data.partition_files`). :class:`RowPool` holds the clients' test rows
once each, for evaluation.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import numpy as np
import polars as pl

from fedcomm.data.partitioners import (
    PARTITIONERS,
    ClientSplits,
    PartitionError,
    train_test_split,
)
from fedcomm.data.types import Dataset
from fedcomm.seeding import Stream, numpy_rng

SPLIT = pl.Enum(["train", "test"])
"""Dtype of the ``split`` column."""

#: Part of every partition hash: bump it when the partitioning algorithms change results.
PARTITION_FORMAT = "fedcomm.partition/2"
_RESERVED_PARAMS = frozenset({"labels", "rng", "num_partitions", "natural_id"})


@dataclass(frozen=True)
class PartitionSpec:
    """Everything that determines a partition, besides the dataset itself.

    Attributes:
        kind: partitioner name in :data:`~fedcomm.data.partitioners.PARTITIONERS`.
        num_partitions: number of clients (None: all natural ids, for ``natural_id``).
        params: the partitioner's own keyword arguments, e.g. ``{"alpha": 0.5}``.
        test_fraction: share of each client's rows held out for its test split, in [0, 1);
            must be 0 for a partitioner that picks test rows itself (``lotteryfl``).
        seed: non-negative seed; the stream ``(seed, PARTITION)`` partitions and
            ``(seed, SPLIT, client_id)`` splits each client (:mod:`fedcomm.seeding`).
        validation_fraction: share of each client's *train* rows held out as its validation
            split, in [0, 1). When > 0 the validation rows take the place of the test rows
            (evaluation reads them) and the test rows are left out of the partition entirely,
            so a recipe tuned on this partition never sees a test row. The train/test cut is
            the one of ``validation_fraction = 0`` (same streams); the validation rows come
            from the stream ``(seed, SPLIT, client_id, 1)``. 0 (default) leaves the spec's
            dict, and so every existing partition hash, unchanged.
    """

    kind: str
    num_partitions: int | None
    params: Mapping[str, Any] = field(hash=False)
    test_fraction: float
    seed: int
    validation_fraction: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))  # read-only
        if not 0 <= self.test_fraction < 1:
            raise PartitionError(f"test_fraction must be in [0, 1), got {self.test_fraction!r}")
        if not 0 <= self.validation_fraction < 1:
            raise PartitionError(
                f"validation_fraction must be in [0, 1), got {self.validation_fraction!r}"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise PartitionError(f"seed must be an integer >= 0, got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain JSON-ready values (numpy scalars and tuples converted)."""
        out = {
            "kind": self.kind,
            "num_partitions": self.num_partitions,
            "params": _jsonable(self.params),
            "test_fraction": self.test_fraction,
            "seed": self.seed,
        }
        if self.validation_fraction:  # absent at 0: the hashes of earlier partitions stand
            out["validation_fraction"] = self.validation_fraction
        return out


def _jsonable(value: Any) -> Any:
    """``value`` with mappings, sequences and numpy values turned into JSON types."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"partition parameter value {value!r} is not JSON-serialisable")


def partition_hash(dataset_fingerprint: str, spec: PartitionSpec) -> str:
    """Content hash of a partition: sha256 (hex) of the dataset fingerprint and the spec.

    Args:
        dataset_fingerprint: :meth:`Dataset.fingerprint` of the partitioned dataset.
        spec: the partition spec.

    Returns:
        64 hex characters; equal hashes mean identical partitions.
    """
    canonical = json.dumps(
        spec.to_dict(), sort_keys=True, separators=(",", ":"), allow_nan=False, ensure_ascii=True
    )
    payload = "\n".join((PARTITION_FORMAT, dataset_fingerprint, canonical))
    return hashlib.sha256(payload.encode()).hexdigest()


def frozen_rows(rows: np.ndarray) -> np.ndarray:
    """``rows`` as a read-only int64 array."""
    out = np.asarray(rows, dtype=np.int64)
    out.setflags(write=False)
    return out


@dataclass(frozen=True, eq=False)
class Partition:
    """Per-client train and test rows of one dataset.

    Attributes:
        hash: :func:`partition_hash` of the dataset and spec it was built from.
        client_ids: ``(K,)`` int64, ``0..K-1``.
        train: per client, sorted ``int64`` row indices into the dataset; disjoint between
            clients.
        test: per client, sorted ``int64`` row indices, disjoint from every client's train
            rows. Usually disjoint between clients too; a partitioner returning
            :class:`~fedcomm.data.partitioners.ClientSplits` may share test rows between
            clients (``lotteryfl``), and a row then appears once per client in the tables.
        num_classes: the dataset's number of classes.
    """

    hash: str
    client_ids: np.ndarray
    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]
    num_classes: int

    def __post_init__(self) -> None:
        k = len(self.client_ids)
        if len(self.train) != k or len(self.test) != k:
            raise ValueError(
                f"partition has {k} clients but {len(self.train)} train and "
                f"{len(self.test)} test row sets"
            )

    @property
    def num_clients(self) -> int:
        """Number of clients ``K``."""
        return len(self.client_ids)

    def assignments(self) -> pl.DataFrame:
        """One row per (client, split, dataset row), sorted; the ``assignments.parquet`` table."""
        frames = [
            _split_frame(self.client_ids, parts, name)
            for name, parts in (("train", self.train), ("test", self.test))
        ]
        return pl.concat(frames).sort("client_id", "split", "row")

    def label_counts(self, labels: np.ndarray) -> pl.DataFrame:
        """Rows per (client_id, split, label); labels with no rows are omitted.

        Args:
            labels: ``(n,)`` labels of the dataset (e.g. ``dataset.labels``).

        Returns:
            Columns ``client_id`` (int32), ``split``, ``label`` (int64), ``count`` (int64).
        """
        table = self.assignments()
        label = np.asarray(labels)[table["row"].to_numpy()].astype(np.int64)
        return (
            table.with_columns(label=pl.Series(label, dtype=pl.Int64))
            .group_by("client_id", "split", "label")
            .agg(count=pl.len().cast(pl.Int64))
            .sort("client_id", "split", "label")
        )


def _split_frame(client_ids: np.ndarray, parts: tuple[np.ndarray, ...], name: str) -> pl.DataFrame:
    sizes = [len(p) for p in parts]
    rows = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    table = pl.DataFrame(
        {
            "client_id": pl.Series(np.repeat(client_ids, sizes), dtype=pl.Int32),
            "row": pl.Series(rows, dtype=pl.Int64),
        }
    )
    return table.select("client_id", pl.lit(name, dtype=SPLIT).alias("split"), "row")


# --- building -----------------------------------------------------------------------------


def _partitioner_kwargs(dataset: Dataset, spec: PartitionSpec) -> dict[str, Any]:
    """``spec.params`` checked against the partitioner's signature (+ ``natural_id``)."""
    if spec.kind not in PARTITIONERS:
        raise PartitionError(f"unknown partition kind {spec.kind!r}; known: {sorted(PARTITIONERS)}")
    signature = inspect.signature(PARTITIONERS[spec.kind]).parameters
    accepted = set(signature) - _RESERVED_PARAMS
    bad = sorted(set(spec.params) - accepted)
    if bad:
        raise PartitionError(f"{spec.kind}: unknown params {bad}; allowed: {sorted(accepted)}")
    required = {name for name in accepted if signature[name].default is inspect.Parameter.empty}
    missing = sorted(required - set(spec.params))
    if missing:
        raise PartitionError(f"{spec.kind}: missing required params {missing}")
    kwargs = dict(spec.params)
    if "natural_id" in signature:
        if dataset.natural_id is None:
            raise PartitionError(
                f"partition kind {spec.kind!r} needs natural ids, but dataset "
                f"{dataset.name!r} has none"
            )
        kwargs["natural_id"] = dataset.natural_id
    return kwargs


def make_partition(dataset: Dataset, spec: PartitionSpec) -> Partition:
    """Partition ``dataset`` over clients, then split each client's rows into train/test.

    A partitioner returning :class:`~fedcomm.data.partitioners.ClientSplits` has chosen the
    test rows itself; its splits are used as they are (``spec.test_fraction`` must be 0).

    Args:
        dataset: the pooled dataset.
        spec: partitioner, its parameters, test fraction and seed.

    Returns:
        The partition; deterministic given the dataset and ``spec``.

    Raises:
        PartitionError: unknown kind or params, or the partitioner rejects them.
    """
    kwargs = _partitioner_kwargs(dataset, spec)
    rng = numpy_rng(spec.seed, Stream.PARTITION)
    fn = PARTITIONERS[spec.kind]
    parts = fn(dataset.labels, rng=rng, num_partitions=spec.num_partitions, **kwargs)
    if isinstance(parts, ClientSplits):
        if spec.test_fraction != 0:
            raise PartitionError(
                f"{spec.kind} picks each client's test rows itself; test_fraction must be 0, "
                f"got {spec.test_fraction!r}"
            )
        splits = list(zip(parts.train, parts.test, strict=True))
    else:
        splits = [
            train_test_split(
                dataset.labels,
                rows,
                test_fraction=spec.test_fraction,
                rng=numpy_rng(spec.seed, Stream.SPLIT, client),
            )
            for client, rows in enumerate(parts)
        ]
    if spec.validation_fraction:
        splits = [
            _validation_split(dataset.labels, train, spec, client)
            for client, (train, _) in enumerate(splits)
        ]
    return Partition(
        hash=partition_hash(dataset.fingerprint(), spec),
        client_ids=np.arange(len(splits), dtype=np.int64),
        train=tuple(frozen_rows(train) for train, _ in splits),
        test=tuple(frozen_rows(test) for _, test in splits),
        num_classes=dataset.num_classes,
    )


def _validation_split(
    labels: np.ndarray, train: np.ndarray, spec: PartitionSpec, client: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(train - validation, validation)`` of one client; its test rows are dropped."""
    return train_test_split(
        labels,
        train,
        test_fraction=spec.validation_fraction,
        rng=numpy_rng(spec.seed, Stream.SPLIT, client, 1),
    )


# --- shared test rows ---------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RowPool:
    """The clients' test splits as indices into one pool of distinct dataset rows.

    A partitioner may give many clients the same test rows (``lotteryfl``: every client holding
    a class tests on that class's rows). The pool holds each such row once, so a model's
    predictions on it are computed once and every client's (and the union's) metrics are
    gathered from them.

    Attributes:
        rows: ``(P,)`` int64 dataset rows of the pool, each once (``P`` <= dataset rows).
        clients: per client, ``(n_c,)`` int64 positions in ``rows`` of its test split, in
            the split's order.
        union: ``(sum n_c,)`` int64 positions in ``rows`` of the union of the clients' splits
            (concatenated in client order, duplicates kept); ``None`` when no row is shared,
            and the pool is then that union itself, in that order.
    """

    rows: np.ndarray
    clients: tuple[np.ndarray, ...]
    union: np.ndarray | None

    @classmethod
    def of(cls, test: tuple[np.ndarray, ...] | list[np.ndarray]) -> RowPool:
        """The pool of the per-client test rows ``test`` (e.g. :attr:`Partition.test`)."""
        parts = [np.asarray(t, dtype=np.int64) for t in test]
        if not parts:
            return cls(frozen_rows(np.zeros(0, np.int64)), (), None)
        sizes = [len(t) for t in parts]
        union = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        cuts = np.cumsum(sizes)[:-1]
        pool, where = np.unique(union, return_inverse=True)
        if len(pool) == len(union):  # nothing shared: the pool is the union, in order
            positions = frozen_rows(np.arange(len(union), dtype=np.int64))
            return cls(frozen_rows(union), tuple(np.split(positions, cuts)), None)
        where = frozen_rows(where.reshape(-1))
        return cls(frozen_rows(pool), tuple(np.split(where, cuts)), where)
