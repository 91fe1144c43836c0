"""Reading back what the train and evaluate stages wrote, with one clear error per damaged file.

``evaluate`` reads a run's ``train/`` folder (``rounds``, ``ledger`` and ``clients`` tables,
``model.safetensors``, ``run.json``); ``summarize`` reads every run's ``rounds`` table and
``summary.json``. Each reader raises :class:`RunFileError` (one line: the file, what is wrong,
the command that rewrites it) when a file is missing, empty, truncated, corrupted or written by
another version (columns or keys this version needs are absent; a model whose tensors do not fit
the configured model; a run trained with other params than the current ones).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import torch

from fedcomm.comm.ledger import REQUIRED as LEDGER_COLUMNS
from fedcomm.errors import InputError, one_line
from fedcomm.sparse_io import load_sparse
from fedcomm.types import ParamDict

ROUNDS_COLUMNS = ("round", "comm/cum_bytes", "comm/cum_gib", "global/accuracy")
CLIENTS_COLUMNS = ("round", "client_id", "train_s")
RUN_KEYS = ("config", "rounds")
SUMMARY_KEYS = ("final", "best", "at_budget", "to_target")  # summary.json (evaluate stage)


class RunFileError(InputError, ValueError):
    """A file written by ``train`` or ``evaluate`` is missing, damaged or from another version."""


def train_remedy(run: str, seed: int) -> str:
    return f"re-run `fedcomm train --run {run} --seed {seed}` (or `dvc repro`) to rewrite it"


def evaluate_remedy(run: str, seed: int) -> str:
    return f"re-run `fedcomm evaluate --run {run} --seed {seed}` (or `dvc repro`) to rewrite it"


def _fail(path: Path, what: str, remedy: str) -> RunFileError:
    return RunFileError(f"{path}: {what}; {remedy}")


def _present(path: Path, remedy: str) -> None:
    if not path.is_file():
        raise _fail(path, "missing", remedy)
    if path.stat().st_size == 0:
        raise _fail(path, "empty", remedy)


def read_table(path: Path, columns: Iterable[str], remedy: str) -> pl.DataFrame:
    """A parquet table that has (at least) ``columns``."""
    _present(path, remedy)
    try:
        frame = pl.read_parquet(path)
    except Exception as err:  # polars/arrow raise several types for a damaged file
        raise _fail(path, f"not a readable parquet table ({one_line(err)})", remedy) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise _fail(path, f"lacks column(s) {missing} (written by another version?)", remedy)
    return frame


def read_json(path: Path, keys: Iterable[str], remedy: str) -> dict[str, Any]:
    """A JSON object that has (at least) ``keys``."""
    _present(path, remedy)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _fail(path, f"not valid JSON ({one_line(err)})", remedy) from None
    if not isinstance(doc, dict):
        raise _fail(path, f"expected a JSON object, got {type(doc).__name__}", remedy)
    missing = [k for k in keys if k not in doc]
    if missing:
        raise _fail(path, f"lacks key(s) {missing} (written by another version?)", remedy)
    return doc


def read_model(path: Path, remedy: str) -> ParamDict:
    """The dense tensors of a ``model.safetensors`` written by :func:`save_sparse`."""
    _present(path, remedy)
    try:
        return load_sparse(path)
    except Exception as err:  # safetensors, json and layout errors of a damaged file
        raise _fail(path, f"not a readable fedcomm model file ({one_line(err)})", remedy) from None


def misfit(
    tensors: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    model: str = "the configured model",
    *,
    lacks: str = "",
    shape: str = "",
) -> str | None:
    """Why saved ``tensors`` do not fit a model whose ``state_dict()`` is ``state`` (``model``
    names it): the first tensor it lacks, or whose shape differs; None when each is one of its
    tensors with its shape. ``lacks`` / ``shape`` are appended to the message of that case.
    (A saved model may hold fewer tensors than its model: ProgFed's final sub-model has no heads
    of earlier stages.)"""
    for name, tensor in tensors.items():
        if name not in state:
            return f"has tensor {name!r}, which {model} lacks{lacks}"
        if tuple(tensor.shape) != tuple(state[name].shape):
            return (
                f"tensor {name!r} has shape {tuple(tensor.shape)}, {model} "
                f"{tuple(state[name].shape)}{shape}"
            )
    return None


def check_fits(
    members: Iterable[ParamDict], model: torch.nn.Module, path: Path, remedy: str
) -> None:
    """Every saved tensor is one of ``model``'s, with its shape (:func:`misfit`)."""
    state = model.state_dict()
    for member in members:
        problem = misfit(member, state)
        if problem is not None:
            raise _fail(path, problem, remedy)


def check_config(
    info: Mapping[str, Any], config: Mapping[str, Any], path: Path, remedy: str
) -> None:
    """The run was trained with ``config`` (the current params' resolved run configuration)."""
    saved = info["config"]
    if not isinstance(saved, dict):
        raise _fail(path, "`config` is not a mapping (written by another version?)", remedy)
    differ = _differences(saved, config)
    if differ:
        shown = ", ".join(differ[:4]) + (", ..." if len(differ) > 4 else "")
        raise _fail(path, f"the run was trained with other params ({shown} differ)", remedy)


def _differences(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted paths of the leaves where two JSON documents differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted({*a, *b}):
            out += _differences(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".") or "<top level>"]


@dataclass(frozen=True)
class TrainedRun:
    """The outputs of one finished ``train`` stage, read back and checked."""

    rounds: pl.DataFrame
    ledger: pl.DataFrame
    clients: pl.DataFrame
    model: ParamDict
    info: dict[str, Any]


def read_trained(folder: Path, remedy: str) -> TrainedRun:
    """Every file of a ``runs/<run>-s<seed>/train/`` folder; :class:`RunFileError` if any is
    missing or damaged (checked before anything is computed or written)."""
    if not folder.is_dir():
        raise _fail(folder, "missing (the run was not trained)", remedy)
    return TrainedRun(
        rounds=read_table(folder / "rounds.parquet", ROUNDS_COLUMNS, remedy),
        ledger=read_table(folder / "ledger.parquet", LEDGER_COLUMNS, remedy),
        clients=read_table(folder / "clients.parquet", CLIENTS_COLUMNS, remedy),
        model=read_model(folder / "model.safetensors", remedy),
        info=read_json(folder / "run.json", RUN_KEYS, remedy),
    )
