"""The summarize stage: every run and seed into ``reports/``.

Writes ``reports/summary.md`` (a table per algorithm: final/best global and local accuracy, GiB
up/down, sparsity, mean ± standard error over seeds) with its PNG plots, ``reports/metrics.json``
(the same numbers for ``dvc metrics show``/``diff``) and ``reports/curves.csv`` (long format:
run, seed, round, cumulative GiB and upload bytes, accuracies; for ``dvc plots``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from fedcomm import atomic
from fedcomm.config import Params
from fedcomm.evaluation.summaries import aggregate_seeds
from fedcomm.experiment import Paths
from fedcomm.reporting.sections import (  # noqa: F401  (re-exported: part of this stage's API)
    best_within_table,
    budget_and_target_sections,
    upload_section,
)
from fedcomm.reporting.summary import write_report
from fedcomm.run_files import (
    METRICS_KEYS,
    ROUNDS_COLUMNS,
    evaluate_remedy,
    read_json,
    read_table,
    train_remedy,
)

CURVE_COLUMNS = {
    "round": "round",
    "comm/cum_gib": "cum_gib",
    "comm/cum_up_bytes": "cum_up_bytes",
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
            table = read_table(
                d / "train" / "rounds.parquet", ROUNDS_COLUMNS, train_remedy(run, seed)
            )
            rounds.setdefault(run, []).append(table)
            metrics = read_json(d / "metrics.json", METRICS_KEYS, evaluate_remedy(run, seed))
            summaries.setdefault(run, []).append(metrics)
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


HEADLINE = {
    "final": (
        "global/accuracy",
        "topk/accuracy",
        "local/accuracy",
        "comm/up_gib",
        "comm/down_gib",
        "comm/cum_gib",
        "model/sparsity",
    ),
    "best": ("global/accuracy", "global/accuracy_round", "local/accuracy"),
}


def headline(summaries: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """``{run: {"final": {"global/accuracy": mean, "global/accuracy_se": se, ...}, "best": ...}}``
    over seeds, in the metric vocabulary: what ``dvc metrics show/diff`` compares."""
    out: dict[str, Any] = {}
    for run, runs in summaries.items():
        agg = aggregate_seeds(runs)
        node: dict[str, Any] = {"seeds": len(runs)}
        for section, keys in HEADLINE.items():
            part: dict[str, Any] = {}
            for key in keys:
                leaf = agg.get(section, {}).get(key)
                if isinstance(leaf, dict) and leaf.get("mean") is not None:
                    part[key] = leaf["mean"]
                    part[f"{key}_se"] = leaf["se"]
            node[section] = part
        out[run] = node
    return out


def divergence_notes(params: Params, rounds: dict[str, list[pl.DataFrame]]) -> list[str]:
    """One warning per seed run that left diverged clients out (``train.on_divergence: skip``):
    its numbers come from fewer clients than configured."""
    notes = []
    for run, tables in rounds.items():
        for seed, t in zip(params.experiment.seeds, tables, strict=True):
            if "train/diverged_clients" not in t.columns:
                continue
            hit = t.filter(pl.col("train/diverged_clients") > 0)
            if hit.height:
                total = int(hit["train/diverged_clients"].sum())
                first = hit["round"].to_list()[0]  # rounds are in order
                notes.append(
                    f"**diverged:** `{run}` seed {seed} left {total} diverged client update(s) "
                    f"out of {hit.height} round(s), first in round {first} "
                    "(train.on_divergence: skip); its numbers are not a clean run's"
                )
    return notes


def _metric_name(params: Params) -> str:
    """``evaluate.metric`` in words: "global accuracy" or "top-3 accuracy"."""
    if params.evaluate.metric == "topk/accuracy":
        return f"top-{params.train.topk} accuracy"
    return "global accuracy"


def summarize_stage(params: Params, paths: Paths = Paths()) -> list[Path]:
    rounds, summaries = collect(params, paths)
    written = write_report(
        paths.reports,
        rounds,
        summaries,
        title=params.summarize.title,
        sections=budget_and_target_sections(summaries, _metric_name(params)),
        metric=params.evaluate.metric,
        notes=divergence_notes(params, rounds),
    )
    atomic.write_json(paths.reports / "metrics.json", headline(summaries))
    table = curves(params, rounds)
    atomic.write_text(paths.reports / "curves.csv", table.write_csv())
    atomic.write_parquet(paths.reports / "curves.parquet", table)
    return [*written, paths.reports / "metrics.json", paths.reports / "curves.csv"]
