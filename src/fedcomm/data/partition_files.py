"""A partition on disk: one small directory (never one file per client, which DVC handles
badly)::

    out_dir/assignments.parquet   # client_id int32, split enum(train, test), row int64
    out_dir/label_counts.parquet  # client_id int32, split, label int64, count int64
    out_dir/manifest.json         # hash, dataset, spec, sizes, fedcomm version

The partition hash (:func:`~fedcomm.data.federated.partition_hash`) is the cache key:
:func:`read_partition` rejects a stored partition whose hash differs from the expected one, and
:func:`partition_is_current` tells a stage whether it can skip rebuilding.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from fedcomm import __version__
from fedcomm.data.federated import (
    PARTITION_FORMAT,
    Partition,
    PartitionSpec,
    frozen_rows,
    partition_hash,
)
from fedcomm.data.types import Dataset
from fedcomm.errors import InputError

ASSIGNMENTS = "assignments.parquet"
LABEL_COUNTS = "label_counts.parquet"
MANIFEST = "manifest.json"
_FILES = (ASSIGNMENTS, LABEL_COUNTS, MANIFEST)
_REBUILD = "Re-run `dvc repro partition` (or `fedcomm partition`) to rebuild it."


class StalePartitionError(InputError, ValueError):
    """A stored partition was built from other data or another spec than expected."""


class PartitionFileError(InputError, ValueError):
    """A stored partition's file is missing, empty, truncated or not what this version wrote."""


class MissingPartitionError(PartitionFileError, FileNotFoundError):
    """The partition directory or one of its files does not exist."""


def _manifest(partition: Partition, dataset: Dataset, spec: PartitionSpec) -> dict[str, Any]:
    return {
        "hash": partition.hash,
        "dataset": dataset.name,
        "dataset_fingerprint": dataset.fingerprint(),
        "spec": spec.to_dict(),
        "num_clients": partition.num_clients,
        "num_rows": len(dataset),
        "num_classes": partition.num_classes,
        "format": PARTITION_FORMAT,
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
    return tuple(frozen_rows(rows) for rows in np.split(sub["row"].to_numpy(), cuts))


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
