"""A comparison report over training runs found in the MLflow store (``fedcomm report``).

Runs are selected by experiment, tags and DVC experiment name (:func:`fedcomm.tracking.query.
find_runs`), grouped by the value of one tag (the ``run`` key by default) and each group's runs
are its seeds (:mod:`.run_groups`). Each run's ``rounds``/``ledger``/``clients`` tables are
downloaded and summarised with :func:`~fedcomm.evaluation.summaries.summarize_run`, so budgets
and accuracy targets can be chosen at report time; the report itself is the summarize stage's
(:func:`~fedcomm.reporting.summary.write_report` with
:func:`~fedcomm.reporting.sections.budget_and_target_sections`) plus a section naming the
MLflow runs.

Outputs under ``out_dir``: ``summary.md``, ``plots/*.png`` and ``runs.parquet`` (one row per
run), all written atomically.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from fedcomm import atomic
from fedcomm.config import ConfigError
from fedcomm.evaluation.curve_points import LAST_K
from fedcomm.evaluation.round_time import DEFAULT_LINK, LinkModel
from fedcomm.evaluation.summaries import summarize_run
from fedcomm.reporting.plots import metric_axis
from fedcomm.reporting.run_groups import select_runs
from fedcomm.reporting.sections import budget_and_target_sections
from fedcomm.reporting.summary import write_report
from fedcomm.tracking.mlflow import DVC_EXP_TAG, resolve_tracking_uri
from fedcomm.tracking.query import (
    TABLES,
    RunRecord,
    download_tables,
    find_runs,
)

EVAL_SUMMARY = "summary.json"  # logged by the evaluate stage; its model-size-based parts are used
OLD_EVAL_SUMMARY = "metrics.json"  # the same summary under its old name, in older runs
_FROM_EVALUATE = ("upload", "comm")  # summary keys that need the dense model's size


@dataclass(frozen=True)
class LoadedRun:
    """A training run with its rounds table and its summary.

    Attributes:
        record: the MLflow run.
        group: its group label (value of the ``group_by`` tag).
        rounds: its ``rounds.parquet`` table.
        summary: :func:`summarize_run` output, plus ``upload``/``comm`` from the evaluate
            stage's ``summary.json`` when the run has one.
    """

    record: RunRecord
    group: str
    rounds: pl.DataFrame
    summary: dict[str, Any]


def describe_filter(
    uri: str | None,
    experiments: Sequence[str],
    tags: Mapping[str, str],
    dvc_exp: str | None,
) -> str:
    """The selection in words, for messages: experiments, tags, DVC experiment, store."""
    exps = ", ".join(experiments) if experiments else "all"
    wanted = {**tags, **({DVC_EXP_TAG: dvc_exp} if dvc_exp is not None else {})}
    tag_text = ", ".join(f"{k}={v}" for k, v in wanted.items()) or "none"
    return f"experiments: {exps}; tags: {tag_text}; store: {resolve_tracking_uri(uri)}"


def _evaluate_parts(path: Path | None) -> dict[str, Any]:
    """The ``upload`` and ``comm`` parts of an evaluate-stage ``summary.json`` (if any)."""
    if path is None:
        return {}
    data = json.loads(path.read_text())
    return {k: data[k] for k in _FROM_EVALUATE if isinstance(data.get(k), dict)}


def _eval_summary_name(rec: RunRecord) -> str | None:
    """The evaluate stage's summary among the run's artifacts: ``summary.json``, or the full
    ``metrics.json`` of a run evaluated before the headline file took that name."""
    if EVAL_SUMMARY in rec.artifacts:
        return EVAL_SUMMARY
    return OLD_EVAL_SUMMARY if OLD_EVAL_SUMMARY in rec.artifacts else None


def load_run(
    uri: str | None,
    rec: RunRecord,
    group: str,
    tmp: Path,
    *,
    summary_options: Mapping[str, Any],
) -> LoadedRun:
    """Download one run's tables into ``tmp`` and summarise it.

    Args:
        uri: tracking URI.
        rec: the run.
        group: its group label.
        tmp: scratch directory (the files are read into memory before returning).
        summary_options: keyword arguments of :func:`summarize_run` (budgets, targets, link...).
    """
    evaluated = _eval_summary_name(rec)
    names = [*TABLES, *([evaluated] if evaluated else [])]
    files = download_tables(uri, rec.run_id, tmp / rec.run_id, names)
    rounds, ledger, clients = (pl.read_parquet(files[name]) for name in TABLES)
    server_s = rounds["time/server_s"] if "time/server_s" in rounds.columns else None
    summary = summarize_run(rounds, ledger, clients, server_s=server_s, **summary_options)
    summary |= _evaluate_parts(files.get(evaluated) if evaluated else None)
    return LoadedRun(rec, group, rounds, summary)


def _check_options(
    targets: Sequence[float],
    budgets: Sequence[float],
    group_by: str,
    time_budgets_h: Sequence[float] = (),
) -> None:
    """Targets in (0, 1], positive (finite) budgets, a non-empty tag name."""
    bad = [t for t in targets if not 0 < t <= 1]
    if bad:
        raise ConfigError(f"targets: accuracy targets must be in (0, 1] (got {bad})")
    if any(b <= 0 for b in budgets):
        raise ConfigError(f"budgets_gib: budgets must be > 0 GiB (got {list(budgets)})")
    if any(not 0 < h < float("inf") for h in time_budgets_h):
        raise ConfigError(
            f"time_budgets_h: simulated-time budgets must be finite and > 0 hours "
            f"(got {list(time_budgets_h)})"
        )
    if not group_by:
        raise ConfigError("group_by: a tag name is required (e.g. 'run' or 'algorithm')")


def _check_metric(runs: Sequence[LoadedRun], metric: str) -> None:
    """``metric`` must be a column of at least one run's rounds table."""
    columns = {c for run in runs for c in run.rounds.columns}
    if metric not in columns:
        known = sorted(c for c in columns if c.endswith("accuracy"))
        raise ConfigError(f"metric: {metric!r} is not measured by these runs (known: {known})")


def metric_words(metric: str) -> str:
    """A metric key in words: ``"global/accuracy"`` -> ``"global accuracy"``,
    ``"topk/accuracy"`` -> ``"top-k accuracy"``."""
    label = metric_axis(metric)[0].removesuffix(" (%)")
    return label[:1].lower() + label[1:]


def _started(ms: int) -> str:
    """Milliseconds since the epoch as ``YYYY-MM-DD HH:MM`` UTC."""
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M")


def runs_section(runs: Sequence[LoadedRun], uri: str | None) -> str:
    """Markdown: group -> seed -> MLflow run id, run name, experiment, DVC experiment, start."""
    rows = [
        "| Group | Seed | MLflow run id | Run name | Experiment | DVC experiment | Started (UTC) |",
        "|---|---:|---|---|---|---|---|",
    ]
    for run in runs:
        rec = run.record
        dvc = rec.tags.get(DVC_EXP_TAG) or "–"
        rows.append(
            f"| `{run.group}` | {rec.seed if rec.seed is not None else '–'} | `{rec.run_id}` "
            f"| {rec.run_name} | {rec.experiment} | {dvc} | {_started(rec.start_time_ms)} |"
        )
    return (
        "## Runs\n\n"
        f"The MLflow runs behind each row; open them with `fedcomm ui --uri "
        f"{resolve_tracking_uri(uri)}` (it starts `mlflow ui` and prints each experiment's runs "
        "page).\n\n" + "\n".join(rows)
    )


RUNS_SCHEMA: dict[str, Any] = {
    "group": pl.String,
    "run_id": pl.String,
    "run_name": pl.String,
    "experiment": pl.String,
    "seed": pl.Int64,
    "dvc_exp": pl.String,
    "start_time_ms": pl.Int64,
    "final_global_accuracy": pl.Float64,
    "best_global_accuracy": pl.Float64,
    "final_local_accuracy": pl.Float64,
    "best_local_accuracy": pl.Float64,
    "final_topk_accuracy": pl.Float64,
    "up_gib": pl.Float64,
    "down_gib": pl.Float64,
    "total_gib": pl.Float64,
}


def runs_frame(runs: Sequence[LoadedRun]) -> pl.DataFrame:
    """One row per run (columns :data:`RUNS_SCHEMA`; accuracies as fractions, sizes in GiB)."""
    rows = []
    for run in runs:
        rec, final, best = run.record, run.summary["final"], run.summary["best"]
        rows.append(
            {
                "group": run.group,
                "run_id": rec.run_id,
                "run_name": rec.run_name,
                "experiment": rec.experiment,
                "seed": rec.seed,
                "dvc_exp": rec.tags.get(DVC_EXP_TAG, ""),
                "start_time_ms": rec.start_time_ms,
                "final_global_accuracy": final.get("global/accuracy"),
                "best_global_accuracy": best.get("global/accuracy"),
                "final_local_accuracy": final.get("local/accuracy"),
                "best_local_accuracy": best.get("local/accuracy"),
                "final_topk_accuracy": final.get("topk/accuracy"),
                "up_gib": final.get("comm/up_gib"),
                "down_gib": final.get("comm/down_gib"),
                "total_gib": final.get("comm/cum_gib"),
            }
        )
    return pl.DataFrame(rows, schema=RUNS_SCHEMA)


def compare_runs(
    uri: str | None,
    out_dir: Path,
    *,
    experiments: Sequence[str] = (),
    tags: Mapping[str, str] | None = None,
    dvc_exp: str | None = None,
    group_by: str = "run",
    targets: Sequence[float] = (),
    budgets_gib: Sequence[float] = (),
    upload_caps_gib: Sequence[float] = (),
    metric: str = "global/accuracy",
    title: str = "fedcomm comparison",
    link: LinkModel = DEFAULT_LINK,
    time_budgets_h: Sequence[float] = (),
    last_k: int = LAST_K,
) -> list[Path]:
    """Write a comparison report of the finished training runs matching the filters.

    Args:
        uri: MLflow tracking URI (``None``: ``$MLFLOW_TRACKING_URI`` or the project's store).
        out_dir: report directory.
        experiments: MLflow experiment names (empty: all).
        tags: tag key -> required value.
        dvc_exp: required DVC experiment name (tag ``dvc.exp_name``).
        group_by: the tag whose value labels a row (``run``, ``algorithm``, ...); a group's runs
            are its seeds (of re-runs of one seed only the newest is kept).
        targets: accuracy targets in (0, 1]: round, GiB and time-to-accuracy (s) to reach each.
        budgets_gib: cumulative communication budgets (GiB, up + down): best accuracy within each.
        upload_caps_gib: cumulative upload caps (GiB): best accuracy within each.
        metric: the accuracy that plots, budgets and targets refer to.
        title: report title.
        link: link bandwidths (Mbit/s) for time-to-accuracy.
        time_budgets_h: simulated-time budgets (hours): best accuracy within each, for runs
            with a ``system`` section (their ``time/sim_elapsed_s``).
        last_k: final accuracy = the mean of each run's last ``last_k`` evaluations (the
            evaluate stage's and the decision rule's meaning; 5 by default).

    Returns:
        The written paths: the three plots, ``summary.md``, ``runs.parquet``.

    Raises:
        ConfigError: no run matches, an unknown experiment, a run without the ``group_by`` tag,
            an unmeasured ``metric`` or out-of-range targets/budgets.
    """
    tags = dict(tags or {})
    _check_options(targets, budgets_gib, group_by, time_budgets_h)
    records = find_runs(uri, experiments=experiments, tags=tags, dvc_exp=dvc_exp)
    if not records:
        where = describe_filter(uri, experiments, tags, dvc_exp)
        raise ConfigError(f"no finished fedcomm training runs match ({where})")
    chosen, notes = select_runs(records, group_by)
    options = {
        "budgets_gib": budgets_gib,
        "upload_caps_gib": upload_caps_gib,
        "targets": targets,
        "link": link,
        "target_metric": metric,
        "time_budgets_h": time_budgets_h,
        "last_k": last_k,
    }
    with tempfile.TemporaryDirectory(prefix="fedcomm-report-") as tmp:
        runs = [load_run(uri, rec, g, Path(tmp), summary_options=options) for g, rec in chosen]
    _check_metric(runs, metric)
    return _write(
        out_dir, runs, notes, uri=uri, title=title, metric=metric, link=link, last_k=last_k
    )


def _closing_notes(runs: Sequence[LoadedRun], link: LinkModel) -> list[str]:
    """The link model behind time-to-accuracy (and, when runs have simulated time, how it
    differs from their simulated clock); runs the evaluate stage never summarised."""
    notes = [
        f"Time-to-accuracy models links of {link.down_mbps:g} Mbit/s down and "
        f"{link.up_mbps:g} Mbit/s up."
    ]
    if any("sim" in r.summary for r in runs):
        notes[0] += (
            " It is the special case of one uniform link for every client, no deadline, no "
            "availability and no simulated compute; the simulated hours are the runs' own "
            "`system` clock."
        )
    missing = sum(_eval_summary_name(r.record) is None for r in runs)
    if missing:
        notes.append(
            f"{missing} of {len(runs)} runs have no `summary.json` (evaluate stage not run): "
            "their upload columns are empty."
        )
    return notes


def _write(
    out_dir: Path,
    runs: Sequence[LoadedRun],
    notes: Sequence[str],
    *,
    uri: str | None,
    title: str,
    metric: str,
    link: LinkModel,
    last_k: int,
) -> list[Path]:
    """The report files: ``summary.md`` with plots (:func:`write_report`), ``runs.parquet``."""
    rounds: dict[str, list[pl.DataFrame]] = {}
    summaries: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        rounds.setdefault(run.group, []).append(run.rounds)
        summaries.setdefault(run.group, []).append(run.summary)
    sections = [
        *budget_and_target_sections(summaries, metric_words(metric)),
        runs_section(runs, uri),
    ]
    written = write_report(
        out_dir,
        rounds,
        summaries,
        title=title,
        notes=[*notes, *_closing_notes(runs, link)],
        sections=sections,
        metric=metric,
        last_k=last_k,
    )
    table = out_dir / "runs.parquet"
    atomic.write_parquet(table, runs_frame(runs))
    return [*written, table]
