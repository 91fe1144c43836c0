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


def _fmt(mean: Any, se: Any, pct: bool) -> str:
    """``mean ± se`` (percent with 2 decimals, or 4 significant digits); ``–`` when missing."""
    if mean is None:
        return "–"
    text = f"{100 * mean:.2f}" if pct else f"{mean:.4g}"
    if not se:
        return text
    return f"{text} ± {100 * se:.2f}" if pct else f"{text} ± {se:.2g}"


def upload_section(aggs: dict[str, dict[str, Any]]) -> str:
    """Upload per client per round (decimal KB), its save ratio against the ``fedavg`` run (if
    the experiment has one), the mean over rounds of the upload ratio against dense (the same
    content sent densely / what was sent), all traffic (both directions) and the uplink alone as
    shares of dense end-to-end FedAvg over ``train.rounds`` (ProgFed's cost ratio; its Table 5
    compares the uplink), and the local training time per round (LTTR)."""

    def mean(agg: dict[str, Any], *path: str) -> Any:
        node: Any = agg
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node.get("mean") if isinstance(node, dict) else None

    base = mean(aggs["fedavg"], "upload", "kb_per_client_round") if "fedavg" in aggs else None
    rows = [
        "| Run | Upload per client per round (KB) | Save ratio vs `fedavg` "
        "| Upload ratio vs dense (mean over rounds) | All traffic vs dense end-to-end "
        "| Upload vs dense end-to-end | LTTR (s) |"
    ]
    rows.append("|---|---:|---:|---:|---:|---:|---:|")
    for run, agg in aggs.items():
        kb = mean(agg, "upload", "kb_per_client_round")
        ratio = f"{base / kb:.2f}x" if base and kb else "–"
        dense = mean(agg, "upload", "up_ratio_mean")
        vs_dense = f"{dense:.2f}x" if dense else "–"
        costs = [mean(agg, "comm", k) for k in ("cost_vs_dense_e2e", "up_cost_vs_dense_e2e")]
        vs_e2e = " | ".join(f"{100 * c:.2f}%" if c is not None else "–" for c in costs)
        lttr = mean(agg, "time", "client_s_mean")
        rows.append(
            f"| `{run}` | {_fmt(kb, None, False)} | {ratio} | {vs_dense} | {vs_e2e} "
            f"| {_fmt(lttr, None, False)} |"
        )
    return "## Upload per client per round\n\n" + "\n".join(rows)


def best_within_table(aggs: dict[str, dict[str, Any]], section: str) -> str | None:
    """A markdown table of best global accuracy (%), rows = runs, columns = the limits found
    (GiB) under ``section`` of the aggregated summaries (``at_budget``, ``at_upload_cap``);
    ``None`` when no run has any."""
    limits = sorted({k for a in aggs.values() for k in a.get(section, {})}, key=float)
    if not limits:
        return None
    rows = ["| Run | " + " | ".join(f"≤ {k} GiB" for k in limits) + " |"]
    rows.append("|---|" + "---:|" * len(limits))
    for run, agg in aggs.items():
        cells = [agg.get(section, {}).get(k) or {} for k in limits]
        rows.append(
            f"| `{run}` | "
            + " | ".join(_fmt(c.get("mean"), c.get("se"), True) for c in cells)
            + " |"
        )
    return "\n".join(rows)


def budget_and_target_sections(
    summaries: dict[str, list[dict[str, Any]]], metric: str = "global accuracy"
) -> list[str]:
    """Markdown tables: best global accuracy within each GiB budget (up + down) and within each
    upload cap (FedDST's Tables 1-3: rows = runs, columns = caps); upload per client per round;
    round, GiB and time-to-accuracy (link model) to reach each target (seeds that never did are
    left out). ``metric`` names the accuracy they refer to (``evaluate.metric``)."""
    aggs = {run: aggregate_seeds(s) for run, s in summaries.items()}
    sections: list[str] = []
    budgets = best_within_table(aggs, "at_budget")
    if budgets:
        sections.append(f"## Best {metric} (%) within a communication budget\n\n" + budgets)
    caps = best_within_table(aggs, "at_upload_cap")
    if caps:
        sections.append(
            f"## Best {metric} (%) within an upload cap\n\n"
            "Best evaluation before all clients together have uploaded more than the cap "
            "(cumulative upload, GiB).\n\n" + caps
        )
    sections.append(upload_section(aggs))
    targets = sorted({t for a in aggs.values() for t in a.get("to_target", {})}, key=float)
    if targets:
        rows = [
            "| Run | Target | Seeds reaching | Round | GiB | Time-to-accuracy (s) |",
            "|---|---:|---:|---:|---:|---:|",
        ]
        for run, agg in aggs.items():
            for t in targets:
                node = agg.get("to_target", {}).get(t) or {}
                reached = (node.get("round") or {}).get("n", 0)
                vals = [
                    _fmt((node.get(k) or {}).get("mean"), (node.get(k) or {}).get("se"), False)
                    for k in ("round", "gib", "tta_s")
                ]
                rows.append(
                    f"| `{run}` | {float(t):.0%} | {reached}/{len(summaries[run])} | "
                    + " | ".join(vals)
                    + " |"
                )
        sections.append(
            f"## Reaching a target {metric}\n\n"
            "Mean ± standard error over the seeds that reached it; "
            "time-to-accuracy under the link model of `evaluate.link`.\n\n" + "\n".join(rows)
        )
    return sections


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
