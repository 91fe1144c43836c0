"""Long curves tables: one row per (run, seed, evaluation round), for plots and for the verdicts.

:func:`long_curves` turns per-seed ``rounds`` tables into the long table (columns ``run``,
``seed``, ``round`` and the metric columns); the summarize stage uses it for
``reports/curves.csv`` and ``fedcomm curves`` for a build's finished runs
(:func:`finished_runs` finds them: a train stage writes ``rounds.parquet`` and then ``run.json``
only when its last round is done, so a run still training has neither).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import yaml

from fedcomm.paths import RUN_DIR
from fedcomm.run_files import ROUNDS_COLUMNS, read_table

EVALUATIONS = ("global/accuracy", "local/accuracy", "topk/accuracy")


def curve_name(column: str) -> str:
    """A metric's column name in a curves table: ``global/accuracy`` -> ``global_accuracy``."""
    return column.replace("/", "_")


def long_curves(
    tables: Iterable[tuple[str, int, pl.DataFrame]],
    columns: Mapping[str, str] | None = None,
    evaluated: Iterable[str] = EVALUATIONS,
) -> pl.DataFrame:
    """The long curves table of ``(run, seed, rounds table)`` triples.

    Args:
        tables: each run label, seed and its ``rounds`` table (one row per round).
        columns: ``{rounds column: curves column}`` to keep (those a table has); ``None``: every
            numeric column, named by :func:`curve_name`.
        evaluated: a round is kept when one of these columns is not null in it (an evaluation
            round).

    Returns:
        Columns ``run``, ``seed``, ``round`` and the metric columns (null where a seed's table
        lacks one), rows in the order given and by round.
    """
    evaluated = tuple(evaluated)
    frames = []
    for run, seed, table in tables:
        keep = [c for c in evaluated if c in table.columns]
        if columns is None:
            chosen = {
                c: curve_name(c)
                for c, dtype in table.schema.items()
                if c != "round" and dtype.is_numeric()
            }
        else:
            chosen = {c: a for c, a in columns.items() if c in table.columns and c != "round"}
        rows = (
            table.filter(pl.any_horizontal(pl.col(c).is_not_null() for c in keep))
            if keep
            else table.clear()
        )
        frames.append(
            rows.sort("round").select(
                pl.lit(run).alias("run"),
                pl.lit(seed, dtype=pl.Int64).alias("seed"),
                pl.col("round"),
                *(pl.col(c).alias(a) for c, a in chosen.items()),
            )
        )
    if not frames:
        return pl.DataFrame(schema={"run": pl.String, "seed": pl.Int64, "round": pl.Int32})
    return pl.concat(frames, how="diagonal_relaxed")


@dataclass(frozen=True)
class BuildRuns:
    """A build's run folders: the finished ones (``(run, seed, train folder)``) and the others,
    each with why it was skipped."""

    finished: list[tuple[str, int, Path]]
    unfinished: list[str]


def _finished(train: Path) -> str | None:
    """``None`` if ``train`` holds a finished train stage's rounds, else why not."""
    info, rounds = train / "run.json", train / "rounds.parquet"
    if not info.is_file():
        return "still training (no train/run.json)"
    if not rounds.is_file():
        return "no train/rounds.parquet"
    try:
        done = int(json.loads(info.read_text(encoding="utf-8"))["rounds"])
    except (ValueError, KeyError, TypeError) as err:
        return f"train/run.json unreadable ({err})"
    last = pl.scan_parquet(rounds).select(pl.col("round").max()).collect().item()
    if last != done:
        return f"train/rounds.parquet ends at round {last}, run.json says {done}"
    return None


def finished_runs(build: Path) -> BuildRuns:
    """The run folders of a build (``<build>/runs/<run>-s<seed>/``) whose train stage finished,
    and the ones that did not: a folder without finished outputs, a checkpoint in
    ``<build>/.fedcomm/checkpoints/`` of a run with none, a run and seed of the build's
    ``params.yaml`` (``experiment.runs`` x ``experiment.seeds``) with no folder yet."""
    finished: list[tuple[str, int, Path]] = []
    unfinished: list[str] = []
    runs = build / "runs"
    names = {p.name for p in runs.iterdir() if p.is_dir()} if runs.is_dir() else set()
    checkpoints = build / ".fedcomm" / "checkpoints"
    if checkpoints.is_dir():
        names |= {p.name for p in checkpoints.iterdir() if (p / "state.pt").is_file()}
    expected = _expected(build / "params.yaml")
    for name in sorted(names | expected):
        match = RUN_DIR.match(name)
        if match is None:
            continue
        if name not in names:
            unfinished.append(f"{name}: not started (in params.yaml, no run folder)")
            continue
        why = _finished(runs / name / "train")
        if why is None:
            finished.append((match["run"], int(match["seed"]), runs / name / "train"))
        else:
            unfinished.append(f"{name}: {why}")
    return BuildRuns(finished, unfinished)


def _expected(params: Path) -> set[str]:
    """``<run>-s<seed>`` of every run and seed of a build's params (none without the file)."""
    if not params.is_file():
        return set()
    doc = yaml.safe_load(params.read_text(encoding="utf-8"))
    exp = doc.get("experiment") if isinstance(doc, dict) else None
    if not isinstance(exp, dict):
        return set()
    runs, seeds = exp.get("runs") or [], exp.get("seeds") or []
    return {f"{r}-s{s}" for r in runs for s in seeds}


def build_curves(build: Path) -> tuple[pl.DataFrame, list[str]]:
    """The long curves table (every numeric metric) of a build's finished runs, and the
    skipped run folders with why (:func:`finished_runs`)."""
    found = finished_runs(build)
    tables = [
        (run, seed, read_table(train / "rounds.parquet", ROUNDS_COLUMNS, _remedy(build)))
        for run, seed, train in found.finished
    ]
    return long_curves(tables), found.unfinished


def _remedy(build: Path) -> str:
    return f"rerun the build's train stage (`dvc repro` in {build})"
