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
from fedcomm.comm.ledger import Row
from fedcomm.errors import InputWarning, one_line

FORMAT_VERSION = 1


@dataclass
class RunState:
    """The mutable progress of a run (owned by the loop, saved as a whole)."""

    config_hash: str
    round_: int = 0
    server: Any = None
    clients: dict[int, Any] = field(default_factory=dict)
    ledger_rows: list[Row] = field(default_factory=list)
    round_rows: list[dict[str, Any]] = field(default_factory=list)
    client_rows: list[dict[str, Any]] = field(default_factory=list)
    run_id: str | None = None
    # asynchronous aggregation: the clients in flight and the model versions they hold
    # (:class:`fedcomm.simulation.asynchronous.Flight`); None in synchronous rounds
    flight: Any = None
    # Oort's knowledge of the clients (:class:`fedcomm.system.oort.Arms`); None: uniform
    selection: Any = None


def save(state: RunState, path: Path) -> None:
    with atomic_path(path) as tmp:
        torch.save({"version": FORMAT_VERSION, "state": state}, tmp)


def load(
    path: Path, config_hash: str, *, map_location: torch.device | str = "cpu"
) -> RunState | None:
    """The saved state if ``path`` exists and was made by the same configuration, else None;
    its tensors on ``map_location`` (a checkpoint made on a GPU resumes on the CPU too).

    A checkpoint is a cache: one that cannot be used (empty, truncated, corrupted, written by
    another version, or made with other params or code) is not an error. It warns once, with
    a :class:`CheckpointWarning` naming the file and why (for an unreadable one, torch's whole
    message), and the run restarts from round 1.
    """
    if not path.is_file():
        return None
    try:
        blob = torch.load(path, weights_only=False, map_location=map_location)
    except Exception as err:  # empty, truncated or corrupted: any unpickling error
        why = f"is unreadable ({one_line(err)})"  # torch's whole reason, on one line
    else:
        version = blob.get("version") if isinstance(blob, dict) else None
        state = blob.get("state") if isinstance(blob, dict) else None
        if version != FORMAT_VERSION or not isinstance(state, RunState):
            why = f"has format {version!r}, this version reads {FORMAT_VERSION}"
        elif state.config_hash != config_hash:
            why = "was made with other params or code"
        else:
            return state
    warnings.warn(
        CheckpointWarning(f"{path}: checkpoint {why}; ignoring it, training restarts at round 1"),
        stacklevel=2,
    )
    return None


class CheckpointWarning(InputWarning):
    """A checkpoint that cannot be resumed (the run starts afresh)."""
