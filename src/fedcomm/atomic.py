"""Atomic file writes: every output appears whole or not at all.

:func:`atomic_path` yields a temporary path beside the destination; on success the file is made
readable (0644) and renamed over the destination in one step, on failure it is removed. A killed
process therefore never leaves a half-written output, only (at worst) a hidden ``.*.tmp`` file.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import polars as pl


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary sibling of ``path`` to write to; renamed onto ``path`` when the block ends."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; outputs are meant to be read
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, data: Any) -> None:
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")


def write_parquet(path: Path, frame: pl.DataFrame) -> None:
    with atomic_path(path) as tmp:
        frame.write_parquet(tmp)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` (created if needed) for the block: serialises
    processes of one machine (e.g. sweep workers) around a shared first write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
