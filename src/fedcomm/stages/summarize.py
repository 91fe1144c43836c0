"""The summarize stage: every run and seed into ``reports/``.

Writes ``reports/summary.md`` (a table per algorithm: final/best global and local accuracy, GiB
up/down, sparsity, mean ± standard error over seeds; final accuracy = the mean of each seed's
last ``evaluate.last_k`` evaluations, as in each run's ``metrics.json``) with its PNG plots and
the ``summarize.paired`` comparisons decided by the rule (paired t over seeds),
``reports/summary.json`` (the same numbers over seeds, the comparisons under ``paired``; not a
DVC metric: ``dvc metrics show`` lists the runs' headline numbers) and
``reports/curves.csv`` (long format: run, seed, round, cumulative GiB and upload bytes,
accuracies, sparsity; for ``dvc plots`` and ``fedcomm verdicts``), and ``reports/interactive.html``
(the curves, mean ± SE over seeds, Vega inline) with ``reports/dvc_plots_template.html``
(``dvc plots show``'s page template, ``.dvc/config``). With tracking on, the same report is logged
on the experiment's MLflow ``summary`` run (:mod:`fedcomm.tracking.summary_run`).

Runs with a ``system`` section (simulated time) also get, recomputed here from each
seed's rounds table: a "Simulated time" section (simulated hours, clients per round), the best
accuracy within each ``evaluate.time_budgets_h``, the simulated hours to each target, the plot
of accuracy against GiB beside accuracy against simulated hours, ``sim`` and
``at_time_budget_h`` in ``summary.json`` and the ``sim_elapsed_s`` column in ``curves.csv``. With
``system.energy`` also the clients' joules: an "Energy" section, the joules to each target, the
plot of accuracy against cumulative energy, ``energy`` in ``summary.json`` and ``energy_cum_j``
in ``curves.csv``. Without simulated time every output is what it was before.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from fedcomm import atomic
from fedcomm.config import CURVE_COLUMNS, Params
from fedcomm.evaluation.headline import final_keys
from fedcomm.evaluation.seeds import aggregate_seeds
from fedcomm.evaluation.sim_time import has_sim_time, merge_sim_time, sim_time_summary
from fedcomm.reporting.curves import long_curves
from fedcomm.reporting.interactive import PAGE, write_pages
from fedcomm.reporting.sections import (  # noqa: F401  (re-exported: part of this stage's API)
    PairedRow,
    best_within_table,
    budget_and_target_sections,
    paired_section,
    upload_section,
)
from fedcomm.reporting.summary import write_report
from fedcomm.reporting.verdict import final_per_seed, paired
from fedcomm.run_files import (
    ROUNDS_COLUMNS,
    SUMMARY_KEYS,
    evaluate_remedy,
    read_json,
    read_table,
    train_remedy,
)
from fedcomm.stages.paths import Paths


def collect(
    params: Params, paths: Paths
) -> tuple[dict[str, list[pl.DataFrame]], dict[str, list[dict[str, Any]]]]:
    """Per run label: the rounds tables and the summary.json summaries of its seeds."""
    rounds: dict[str, list[pl.DataFrame]] = {}
    summaries: dict[str, list[dict[str, Any]]] = {}
    for run in params.experiment.runs:
        for seed in params.experiment.seeds:
            d = paths.run_dir(run, seed)
            table = read_table(
                d / "train" / "rounds.parquet", ROUNDS_COLUMNS, train_remedy(run, seed)
            )
            rounds.setdefault(run, []).append(table)
            metrics = read_json(d / "summary.json", SUMMARY_KEYS, evaluate_remedy(run, seed))
            summaries.setdefault(run, []).append(with_sim_time(params, table, metrics))
    return rounds, summaries


def with_sim_time(params: Params, rounds: pl.DataFrame, metrics: dict[str, Any]) -> dict[str, Any]:
    """A seed's evaluate-stage summary with its simulated-time parts recomputed from its rounds
    table under this stage's ``evaluate`` params (``time_budgets_h``, ``targets``, ``metric``;
    :func:`~fedcomm.evaluation.sim_time.sim_time_summary`): ``metrics`` itself when the run has
    no simulated time."""
    ev = params.evaluate
    sim = sim_time_summary(
        rounds, time_budgets_h=ev.time_budgets_h, targets=ev.targets, target_metric=ev.metric
    )
    return merge_sim_time(metrics, sim)


def curves(params: Params, rounds: dict[str, list[pl.DataFrame]]) -> pl.DataFrame:
    """``reports/curves.csv``: the :data:`CURVE_COLUMNS` of every run and seed at the rounds the
    global model was evaluated (columns ``run``, ``seed``, ``round``, then the metrics)."""
    tables = (
        (run, seed, t)
        for run, seeds in rounds.items()
        for seed, t in zip(params.experiment.seeds, seeds, strict=True)
    )
    return long_curves(tables, CURVE_COLUMNS, evaluated=["global/accuracy"])


def paired_comparisons(params: Params, rounds: dict[str, list[pl.DataFrame]]) -> list[PairedRow]:
    """Each ``summarize.paired`` comparison decided by the rule over the seeds: final = the mean
    of a seed's last ``evaluate.last_k`` evaluations of the metric (every round that
    evaluated it, as the results table's final columns)."""
    runs = sorted({run for pair in params.summarize.paired for run in (pair.a, pair.b)})
    table = long_curves(
        (
            (run, seed, t)
            for run in runs
            for seed, t in zip(params.experiment.seeds, rounds[run], strict=True)
        ),
        CURVE_COLUMNS,
    )
    out = []
    last_k = params.evaluate.last_k
    for pair in params.summarize.paired:
        a, b = (
            final_per_seed(table, run, pair.metric, last_k=last_k).values
            if pair.metric in table.columns
            else {}
            for run in (pair.a, pair.b)
        )
        result = paired(a, b, direction=pair.direction, margin=pair.margin, scale=pair.shown_scale)
        out.append(PairedRow(pair.a, pair.b, pair.metric, pair.shown_scale, result))
    return out


OVER_SEEDS = {  # reports/summary.json: per run, these keys of each section (mean and _se)
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
    "sim": ("elapsed_h", "round_s_mean", "dropped_share"),  # runs with a `system` section only
    "energy": ("total_j", "round_j_mean", "dropped_share"),  # runs with `system.energy` only
}
ALWAYS = ("final", "best")  # the other OVER_SEEDS sections only when a run has them


def over_seeds_summary(summaries: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """``{run: {"final": {"global/accuracy": mean, "global/accuracy_se": se, ...}, "best": ...}}``
    over seeds, in the metric vocabulary (``reports/summary.json``)."""
    out: dict[str, Any] = {}
    for run, runs in summaries.items():
        agg = aggregate_seeds(runs)
        node: dict[str, Any] = {"seeds": len(runs)}
        for section, keys in OVER_SEEDS.items():
            part: dict[str, Any] = {}
            for key in keys:
                leaf = agg.get(section, {}).get(key)
                if isinstance(leaf, dict) and leaf.get("mean") is not None:
                    part[key] = leaf["mean"]
                    part[f"{key}_se"] = leaf["se"]
            if part or section in ALWAYS:
                node[section] = part
        at_time: dict[str, Any] = {}
        for hours, leaf in (agg.get("at_time_budget") or {}).items():
            if leaf.get("mean") is not None:
                at_time |= {hours: leaf["mean"], f"{hours}_se": leaf["se"]}
        if at_time:
            node["at_time_budget_h"] = at_time
        out[run] = node
    return out


def sim_time_notes(params: Params, rounds: dict[str, list[pl.DataFrame]]) -> list[str]:
    """A note when ``evaluate.time_budgets_h`` is set but no run has simulated time (no
    ``system`` section): the budgets were not applied."""
    if not params.evaluate.time_budgets_h:
        return []
    if any(has_sim_time(t) for tables in rounds.values() for t in tables):
        return []
    return [
        f"evaluate.time_budgets_h ({params.evaluate.time_budgets_h}) was not applied: no run "
        "has simulated time (`time/sim_elapsed_s`; runs need a `system` section)"
    ]


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
    last_k = params.evaluate.last_k
    comparisons = paired_comparisons(params, rounds)
    sections = budget_and_target_sections(summaries, _metric_name(params))
    if comparisons:
        sections.insert(0, paired_section(comparisons, last_k))
    written = write_report(
        paths.reports,
        rounds,
        summaries,
        title=params.summarize.title,
        sections=sections,
        metric=params.evaluate.metric,
        notes=[*divergence_notes(params, rounds), *sim_time_notes(params, rounds)],
        last_k=last_k,
    )
    over_seeds = over_seeds_summary(summaries)
    if comparisons:
        over_seeds["paired"] = [row.as_dict(last_k) for row in comparisons]
    atomic.write_json(paths.reports / "summary.json", over_seeds)
    table = curves(params, rounds)
    atomic.write_text(paths.reports / "curves.csv", table.write_csv())
    atomic.write_parquet(paths.reports / "curves.parquet", table)
    pages = write_pages(  # interactive.html and dvc plots show's template, Vega inline (offline)
        paths.reports,
        table,
        title=params.summarize.title,
        metric=params.evaluate.metric,
        metric_label=_metric_name(params),
    )
    if params.tracking.enabled:
        from fedcomm.tracking.summary_run import log_summary_run

        log_summary_run(
            uri=params.tracking.uri,
            experiment=params.tracking.experiment,
            title=params.summarize.title,
            page=paths.reports / PAGE,
            files=[paths.reports / n for n in ("summary.md", "summary.json", "curves.csv")],
            plots=[p for p in written if p.suffix == ".png"],
            metrics=summary_metrics(over_seeds, params.evaluate.metric),
        )
    return [*written, paths.reports / "summary.json", paths.reports / "curves.csv", *pages]


def summary_metrics(over_seeds: dict[str, Any], metric: str) -> dict[str, float]:
    """``<run>/final_acc`` (of ``metric``), ``<run>/final_local_acc``, ``<run>/up_gib`` and
    ``<run>/down_gib`` (:func:`~fedcomm.evaluation.headline.final_keys`): the means over seeds of
    :func:`over_seeds_summary`, for the summary run."""
    out = {}
    for run, node in over_seeds.items():
        final = node.get("final", {}) if isinstance(node, dict) else {}
        for name, key in final_keys(metric).items():
            if isinstance(final.get(key), int | float):
                out[f"{run}/{name}"] = float(final[key])
    return out
