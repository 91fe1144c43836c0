"""Checkpoints: everything needed to resume a run bit-for-bit.

A checkpoint holds the round reached, the server state, the client store, the ledger, the
per-round and per-client tables so far, and the MLflow run id. Randomness needs no saved state:
every generator is derived from ``(seed, stream, round, client)``. Files are written through a
temporary file and an atomic rename, so a kill during a save leaves the previous checkpoint.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from fedcomm.atomic import atomic_path

FORMAT_VERSION = 1


@dataclass
class RunState:
    """The mutable progress of a run (owned by the loop, saved as a whole)."""

    config_hash: str
    round_: int = 0
    server: Any = None
    clients: dict[int, Any] = field(default_factory=dict)
    ledger_rows: list[tuple[int, int, str, int, int, int, int]] = field(default_factory=list)
    round_rows: list[dict[str, Any]] = field(default_factory=list)
    client_rows: list[dict[str, Any]] = field(default_factory=list)
    run_id: str | None = None


def save(state: RunState, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save({"version": FORMAT_VERSION, "state": state}, tmp)


def load(path: Path, config_hash: str) -> RunState | None:
    """The saved state if ``path`` exists and was made by the same configuration, else None."""
    if not path.is_file():
        return None
    try:
        blob = torch.load(path, weights_only=False)
    except Exception as err:  # truncated or from an incompatible version: start afresh
        warnings.warn(f"ignoring unreadable checkpoint {path}: {err}", stacklevel=2)
        return None
    if not isinstance(blob, dict) or blob.get("version") != FORMAT_VERSION:
        return None
    state: RunState = blob["state"]
    return state if state.config_hash == config_hash else None
