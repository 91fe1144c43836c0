"""The federated view of a dataset: which rows each client holds, for train and for test.

A :class:`Partition` is built from a :class:`~fedcomm.data.types.Dataset` and a
:class:`PartitionSpec` by :func:`make_partition`, and stored as one small directory (never one
file per client, which DVC handles badly)::

    out_dir/assignments.parquet   # client_id int32, split enum(train, test), row int64
    out_dir/label_counts.parquet  # client_id int32, split, label int64, count int64
    out_dir/manifest.json         # hash, dataset, spec, sizes, fedcomm version

The partition hash (sha256 of the dataset fingerprint and the canonical spec) is the cache
key: :func:`read_partition` rejects a stored partition whose hash differs from the expected
one, and :func:`partition_is_current` tells a stage whether it can skip rebuilding.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import polars as pl

from fedcomm import __version__
from fedcomm.data.partitioners import (
    PARTITIONERS,
    ClientSplits,
    PartitionError,
    train_test_split,
)
from fedcomm.data.types import Dataset
from fedcomm.errors import InputError
from fedcomm.seeding import Stream, numpy_rng

SPLIT = pl.Enum(["train", "test"])
"""Dtype of the ``split`` column."""

ASSIGNMENTS = "assignments.parquet"
LABEL_COUNTS = "label_counts.parquet"
MANIFEST = "manifest.json"
_FILES = (ASSIGNMENTS, LABEL_COUNTS, MANIFEST)
_FORMAT = "fedcomm.partition/2"  # bump when the partitioning algorithms change results
_REBUILD = "Re-run `dvc repro partition` (or `fedcomm partition`) to rebuild it."
_RESERVED_PARAMS = frozenset({"labels", "rng", "num_partitions", "natural_id"})


class StalePartitionError(InputError, ValueError):
    """A stored partition was built from other data or another spec than expected."""


class PartitionFileError(InputError, ValueError):
    """A stored partition's file is missing, empty, truncated or not what this version wrote."""


class MissingPartitionError(PartitionFileError, FileNotFoundError):
    """The partition directory or one of its files does not exist."""


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
    """

    kind: str
    num_partitions: int | None
    params: Mapping[str, Any] = field(hash=False)
    test_fraction: float
    seed: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))  # read-only
        if not 0 <= self.test_fraction < 1:
            raise PartitionError(f"test_fraction must be in [0, 1), got {self.test_fraction!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise PartitionError(f"seed must be an integer >= 0, got {self.seed!r}")

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain JSON-ready values (numpy scalars and tuples converted)."""
        return {
            "kind": self.kind,
            "num_partitions": self.num_partitions,
            "params": _jsonable(self.params),
            "test_fraction": self.test_fraction,
            "seed": self.seed,
        }


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
    payload = "\n".join((_FORMAT, dataset_fingerprint, canonical))
    return hashlib.sha256(payload.encode()).hexdigest()


def _frozen(rows: np.ndarray) -> np.ndarray:
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
    return Partition(
        hash=partition_hash(dataset.fingerprint(), spec),
        client_ids=np.arange(len(splits), dtype=np.int64),
        train=tuple(_frozen(train) for train, _ in splits),
        test=tuple(_frozen(test) for _, test in splits),
        num_classes=dataset.num_classes,
    )


# --- storage ------------------------------------------------------------------------------


def _manifest(partition: Partition, dataset: Dataset, spec: PartitionSpec) -> dict[str, Any]:
    return {
        "hash": partition.hash,
        "dataset": dataset.name,
        "dataset_fingerprint": dataset.fingerprint(),
        "spec": spec.to_dict(),
        "num_clients": partition.num_clients,
        "num_rows": len(dataset),
        "num_classes": partition.num_classes,
        "format": _FORMAT,
        "fedcomm_version": __version__,
    }


def _write_files(
    partition: Partition, dataset: Dataset, spec: PartitionSpec, directory: Path
) -> None:
    partition.assignments().write_parquet(directory / ASSIGNMENTS)
    partition.label_counts(dataset.labels).write_parquet(directory / LABEL_COUNTS)
    manifest = _manifest(partition, dataset, spec)
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _swap_in(new: Path, out_dir: Path) -> None:
    """Replace ``out_dir`` by the directory ``new`` (two renames; restored on failure)."""
    if not out_dir.exists():
        os.replace(new, out_dir)
        return
    old = out_dir.with_name(f".{out_dir.name}.old-{uuid.uuid4().hex[:8]}")
    os.replace(out_dir, old)
    try:
        os.replace(new, out_dir)
    except BaseException:
        os.replace(old, out_dir)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_partition(
    partition: Partition, dataset: Dataset, out_dir: Path, spec: PartitionSpec
) -> None:
    """Store ``partition`` as ``out_dir/{assignments,label_counts}.parquet`` + ``manifest.json``.

    The files are written into a temporary sibling directory that then replaces
    ``out_dir``, so readers see either the old partition or the complete new one; if writing
    fails, an existing ``out_dir`` is left untouched and the temporary directory is removed.

    Args:
        partition: the partition, built from ``dataset`` and ``spec``.
        dataset: the partitioned dataset.
        out_dir: target directory (created or replaced).
        spec: the spec ``partition`` was built from.

    Raises:
        ValueError: ``partition.hash`` does not match ``dataset`` and ``spec``.
    """
    out_dir = Path(out_dir)
    if partition.hash != partition_hash(dataset.fingerprint(), spec):
        raise ValueError("partition.hash does not match this dataset and spec")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        tmp.chmod(0o755)  # mkdtemp creates 0o700
        _write_files(partition, dataset, spec, tmp)
        _swap_in(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


_MANIFEST_KEYS = ("hash", "num_clients", "num_classes")


def _read_manifest(out_dir: Path) -> dict[str, Any]:
    missing = [name for name in _FILES if not (out_dir / name).is_file()]
    if missing:
        raise MissingPartitionError(
            f"no complete partition at {out_dir}: missing {', '.join(missing)}. "
            "Run `dvc repro partition` (or `fedcomm partition`) to create it."
        )
    path = out_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise PartitionFileError(f"{path} is not valid JSON ({err}). {_REBUILD}") from None
    if not isinstance(manifest, dict) or any(k not in manifest for k in _MANIFEST_KEYS):
        raise PartitionFileError(
            f"{path} lacks {', '.join(_MANIFEST_KEYS)} (written by another fedcomm version?). "
            + _REBUILD
        )
    return manifest


def _read_assignments(out_dir: Path) -> pl.DataFrame:
    """``assignments.parquet`` with its columns checked; a clear error if it cannot be read."""
    path = out_dir / ASSIGNMENTS
    try:
        table = pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise PartitionFileError(f"{path} cannot be read ({first}). {_REBUILD}") from None
    if not {"client_id", "split", "row"} <= set(table.columns):
        raise PartitionFileError(
            f"{path} has columns {table.columns}, not client_id, split, row "
            f"(written by another fedcomm version?). {_REBUILD}"
        )
    return table.with_columns(pl.col("split").cast(pl.String))


def _rows_by_client(table: pl.DataFrame, split: str, num_clients: int) -> tuple[np.ndarray, ...]:
    sub = table.filter(pl.col("split") == split).sort("client_id", "row")
    ids = sub["client_id"].to_numpy()
    if len(ids) and (ids.min() < 0 or ids.max() >= num_clients):
        raise PartitionFileError(
            f"{ASSIGNMENTS}: client_id outside 0..{num_clients - 1}. " + _REBUILD
        )
    cuts = np.searchsorted(ids, np.arange(1, num_clients))
    return tuple(_frozen(rows) for rows in np.split(sub["row"].to_numpy(), cuts))


def read_partition(out_dir: Path, *, expected_hash: str | None = None) -> Partition:
    """Load a partition written by :func:`write_partition`.

    Args:
        out_dir: the partition directory.
        expected_hash: if given, the hash the partition must have (from
            :func:`partition_hash` of the current dataset and spec).

    Returns:
        The stored partition.

    Raises:
        MissingPartitionError: the directory or one of its files is missing (a
            ``FileNotFoundError``).
        PartitionFileError: a file is unreadable, truncated or of another layout.
        StalePartitionError: the stored hash differs from ``expected_hash``.
    """
    out_dir = Path(out_dir)
    manifest = _read_manifest(out_dir)
    if expected_hash is not None and manifest["hash"] != expected_hash:
        raise StalePartitionError(
            f"partition at {out_dir} is stale: it was built for hash {manifest['hash'][:12]}, "
            f"but the current dataset and partition spec hash to {expected_hash[:12]}. " + _REBUILD
        )
    table = _read_assignments(out_dir)
    k = int(manifest["num_clients"])
    return Partition(
        hash=manifest["hash"],
        client_ids=np.arange(k, dtype=np.int64),
        train=_rows_by_client(table, "train", k),
        test=_rows_by_client(table, "test", k),
        num_classes=int(manifest["num_classes"]),
    )


def partition_is_current(out_dir: Path, expected_hash: str) -> bool:
    """Whether ``out_dir`` holds a complete partition with hash ``expected_hash``."""
    try:
        return bool(_read_manifest(Path(out_dir))["hash"] == expected_hash)
    except PartitionFileError:
        return False


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
            return cls(_frozen(np.zeros(0, np.int64)), (), None)
        sizes = [len(t) for t in parts]
        union = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        cuts = np.cumsum(sizes)[:-1]
        pool, where = np.unique(union, return_inverse=True)
        if len(pool) == len(union):  # nothing shared: the pool is the union, in order
            positions = _frozen(np.arange(len(union), dtype=np.int64))
            return cls(_frozen(union), tuple(np.split(positions, cuts)), None)
        where = _frozen(where.reshape(-1))
        return cls(_frozen(pool), tuple(np.split(where, cuts)), where)
