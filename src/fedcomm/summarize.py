"""The summarize stage: every run and seed into ``reports/``.

Writes ``reports/summary.md`` (a table per algorithm: final/best global and local accuracy, GiB
up/down, sparsity, mean ± standard error over seeds) with its PNG plots, ``reports/metrics.json``
(the same numbers for ``dvc metrics show``/``diff``) and ``reports/curves.csv`` (long format:
run, seed, round, cumulative GiB, accuracies; for ``dvc plots``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from fedcomm.comm.ledger import write_parquet_atomic
from fedcomm.config import Params
from fedcomm.experiment import Paths, _write_json
from fedcomm.reporting.summary import summary_table, write_report, write_text_atomic

CURVE_COLUMNS = {
    "round": "round",
    "comm/cum_gib": "cum_gib",
    "global/accuracy": "global_accuracy",
    "local/accuracy": "local_accuracy",
    "global/loss": "global_loss",
}


def collect(
    params: Params, paths: Paths
) -> tuple[dict[str, list[pl.DataFrame]], dict[str, list[dict[str, Any]]]]:
    """Per run label: the rounds tables and the metrics.json summaries of its seeds."""
    rounds: dict[str, list[pl.DataFrame]] = {}
    summaries: dict[str, list[dict[str, Any]]] = {}
    for run in params.experiment.runs:
        for seed in params.experiment.seeds:
            d = paths.run_dir(run, seed)
            rounds.setdefault(run, []).append(pl.read_parquet(d / "train" / "rounds.parquet"))
            summaries.setdefault(run, []).append(json.loads((d / "metrics.json").read_text()))
    return rounds, summaries


def curves(params: Params, rounds: dict[str, list[pl.DataFrame]]) -> pl.DataFrame:
    frames = []
    for run, tables in rounds.items():
        for seed, t in zip(params.experiment.seeds, tables, strict=True):
            cols = [pl.col(c).alias(a) for c, a in CURVE_COLUMNS.items() if c in t.columns]
            frames.append(
                t.filter(pl.col("global/accuracy").is_not_null())
                .select(cols)
                .with_columns(pl.lit(run).alias("run"), pl.lit(seed).alias("seed"))
            )
    return pl.concat(frames, how="diagonal_relaxed")


def headline(summaries: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """``{run: {metric: mean, metric_se: se}}``: the summary table, for ``dvc metrics``."""
    out: dict[str, dict[str, Any]] = {}
    for row in summary_table(summaries).iter_rows(named=True):
        run = row.pop("algorithm")
        out[run] = {k.removesuffix("_mean"): v for k, v in row.items()}
    return out


def summarize_stage(params: Params, paths: Paths = Paths()) -> list[Path]:
    rounds, summaries = collect(params, paths)
    written = write_report(paths.reports, rounds, summaries, title=params.summarize.title)
    _write_json(paths.reports / "metrics.json", headline(summaries))
    table = curves(params, rounds)
    write_text_atomic(table.write_csv(), paths.reports / "curves.csv")
    write_parquet_atomic(table, paths.reports / "curves.parquet")
    return [*written, paths.reports / "metrics.json", paths.reports / "curves.csv"]
