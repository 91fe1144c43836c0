"""A study's outputs (DVC outs of the ``sweep`` stage), written atomically by every worker when it
finishes (the last writer holds the most trials):

- ``trials.parquet``: one row per trial: number, state, objective value(s), sampled values
  (``param:<key>``), final/best accuracies, GiB, sparsity, MLflow run id, error;
- ``pareto.png``: every finished trial's accuracy against the GiB it sent, the Pareto front
  (non-dominated trials: no other trial is at least as accurate *and* cheaper) highlighted;
- ``history.png``: the objective per trial with the best-so-far line;
- ``best_params.yaml``: the best trial's values as dotted params keys, with the
  ``dvc exp run -S ...`` line that applies them (``fedcomm sweep-args`` prints it);
- ``summary.md``: the best trials and the front as tables, with both plots.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import polars as pl
import yaml
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from optuna.trial import FrozenTrial, TrialState

from fedcomm import atomic
from fedcomm.reporting.plots import save_figure
from fedcomm.sweep.space import Sweep
from fedcomm.sweep.trial import DETAIL_KEYS
from fedcomm.tracking import mlflow as tracking

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
ATTR_COLUMNS = (
    *DETAIL_KEYS,
    "mlflow_run_id",
    "note",
    "error",
)


def counts(study: optuna.Study) -> tuple[int, int]:
    """(finished = complete or pruned, failed) trials of the study, all workers included."""
    trials = study.get_trials(deepcopy=False)
    finished = sum(t.state in FINISHED for t in trials)
    failed = sum(t.state == TrialState.FAIL for t in trials)
    return finished, failed


def best_trial(study: optuna.Study, sweep: Sweep) -> FrozenTrial | None:
    """Single objective: the best trial. Multi: the Pareto trial with the highest accuracy
    (ties: the cheaper)."""
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    if sweep.objective.kind == "single":
        return study.best_trial
    front = study.best_trials
    return max(front, key=lambda t: (t.values[0], -t.values[1])) if front else None


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, int | float) and math.isfinite(float(x)) else None


def trials_frame(study: optuna.Study, sweep: Sweep) -> pl.DataFrame:
    """One row per trial, in trial-number order."""
    names = sweep.objective.names
    rows = []
    for t in study.get_trials(deepcopy=False):
        row: dict[str, Any] = {
            "number": t.number,
            "state": t.state.name,
            "duration_s": t.duration.total_seconds() if t.duration else None,
            "retry_of": t.user_attrs.get("retry_of"),
        }
        for i, name in enumerate(names):
            row[f"value:{name}"] = _num(t.values[i]) if t.values else None
        for key in sweep.space:
            v = t.params.get(key)
            row[f"param:{key}"] = None if v is None else str(v) if isinstance(v, str) else v
        for key in ATTR_COLUMNS:
            row[key] = t.user_attrs.get(key)
        if sweep.objective.sim_time:  # the trial's simulated hours (mean over its seeds)
            row["sim_elapsed_h"] = t.user_attrs.get("sim_elapsed_h")
        rows.append(row)
    frame = pl.DataFrame(rows, infer_schema_length=None)
    return frame.with_columns(pareto=pareto_mask(frame, sweep)) if rows else frame


def _acc_gib(frame: pl.DataFrame, sweep: Sweep) -> tuple[pl.Series, pl.Series]:
    acc = frame[f"value:{sweep.objective.names[0]}"].cast(pl.Float64)
    gib_col = "up_gib" if sweep.objective.comm == "up" else "total_gib"
    gib = frame[gib_col].cast(pl.Float64) if gib_col in frame.columns else acc * math.nan
    return acc, gib


def pareto_mask(frame: pl.DataFrame, sweep: Sweep) -> pl.Series:
    """True for complete trials no other complete trial dominates (accuracy ≥ and GiB ≤, one
    strictly; a minimized first objective, simulated hours to a target, counts as ≤)."""
    acc, gib = _acc_gib(frame, sweep)
    if not sweep.objective.maximize:
        acc = -acc
    ok = [
        s == "COMPLETE" and a is not None and g is not None
        for s, a, g in zip(frame["state"], acc, gib, strict=True)
    ]
    points = [(a, g) if k else None for a, g, k in zip(acc, gib, ok, strict=True)]
    mask = []
    for p in points:
        if p is None:
            mask.append(False)
            continue
        dominated = any(
            q is not None and q[0] >= p[0] and q[1] <= p[1] and (q[0] > p[0] or q[1] < p[1])
            for q in points
        )
        mask.append(not dominated)
    return pl.Series("pareto", mask, dtype=pl.Boolean)


def legend_outside(ax: Axes) -> None:
    """The legend right of the axes, so that it can never cover a plotted point."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize="small")


def plot_pareto(frame: pl.DataFrame, sweep: Sweep, path: Path) -> None:
    """Accuracy (%) against GiB sent for every complete trial; the front as a step line."""
    fig = Figure(figsize=(7.5, 4.8), layout="tight")
    ax = fig.subplots()
    name = sweep.objective.label
    scale = 100.0 if sweep.objective.maximize else 1.0
    if frame.height and "pareto" in frame.columns:
        acc, gib = _acc_gib(frame, sweep)
        done = (frame["state"] == "COMPLETE") & acc.is_not_null() & gib.is_not_null()
        xs, ys = gib.filter(done).to_list(), (scale * acc.filter(done)).to_list()
        ax.scatter(xs, ys, s=28, color="#9aa0a6", label="trials", zorder=2)
        front = frame.filter(done & frame["pareto"]).with_columns(
            _a=scale * acc.filter(done & frame["pareto"]), _g=gib.filter(done & frame["pareto"])
        )
        front = front.sort("_g")
        ax.step(front["_g"], front["_a"], where="post", color="#d62728", linewidth=1.6, zorder=3)
        ax.scatter(front["_g"], front["_a"], s=46, color="#d62728", label="Pareto front", zorder=4)
        for g, a, n in zip(front["_g"], front["_a"], front["number"], strict=True):
            ax.annotate(f"#{n}", (g, a), textcoords="offset points", xytext=(4, 4), fontsize=8)
        positive = [x for x in xs if x > 0]
        if positive and max(positive) / min(positive) > 100:
            ax.set_xscale("log")
    if not frame.height or not (frame["state"] == "COMPLETE").any():
        ax.text(0.5, 0.5, "no complete trial", ha="center", va="center", transform=ax.transAxes)
    comm = "upload" if sweep.objective.comm == "up" else "up + down"
    ax.set(
        title=f"Study {sweep.study}: {name} vs communication",
        xlabel=f"Communication per run, {comm} (GiB)",
        ylabel=f"{name} ({sweep.objective.unit})",
    )
    ax.grid(True, alpha=0.3)
    if frame.height and (frame["state"] == "COMPLETE").any():
        legend_outside(ax)
    save_figure(fig, path)


def plot_history(frame: pl.DataFrame, sweep: Sweep, path: Path) -> None:
    """The accuracy objective per trial (pruned trials marked), with the best so far."""
    fig = Figure(figsize=(7.5, 4.2), layout="tight")
    ax = fig.subplots()
    name = sweep.objective.label
    col = f"value:{sweep.objective.names[0]}"
    maximize = sweep.objective.maximize
    if frame.height and col in frame.columns:
        done = frame.filter(pl.col("state") == "COMPLETE").sort("number")
        ys = [(100 * v if maximize else v) for v in done[col].cast(pl.Float64).to_list()]
        ax.scatter(done["number"], ys, s=24, color="#1f77b4", label="complete", zorder=3)
        best, running = [], -math.inf if maximize else math.inf
        for y in ys:
            running = max(running, y) if maximize else min(running, y)
            best.append(running)
        ax.step(done["number"], best, where="post", color="#d62728", label="best so far")
        pruned = frame.filter(pl.col("state") == "PRUNED")["number"].to_list()
        for n in pruned:
            ax.axvline(n, color="#9aa0a6", alpha=0.35, linewidth=1)
        if pruned:
            ax.plot([], [], color="#9aa0a6", alpha=0.6, label="pruned")
        legend_outside(ax)
    ax.set(
        title=f"Study {sweep.study}: optimisation history",
        xlabel="trial",
        ylabel=f"{name} ({sweep.objective.unit})",
    )
    ax.grid(True, alpha=0.3)
    save_figure(fig, path)


def set_args(values: dict[str, Any]) -> list[str]:
    """``dvc exp run -S`` arguments: ``++key=value`` with YAML scalars (Hydra's ``++`` sets a
    key whether or not the params file already has it; plain ``key=`` fails on a default)."""
    out = []
    for key, value in values.items():
        text = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
        out.append(f"++{key}={text}")
    return out


def best_params_doc(trial: FrozenTrial, sweep: Sweep) -> tuple[dict[str, Any], str]:
    args = set_args(dict(trial.params))
    doc = {
        "study": sweep.study,
        "trial": trial.number,
        "objective": dict(zip(sweep.objective.names, trial.values, strict=True)),
        "base": sweep.base,
        "run": sweep.run,
        "params": dict(trial.params),
    }
    head = (
        f"# Best trial of study {sweep.study} (trial {trial.number}), on top of {sweep.base}.\n"
        "# Apply it as a DVC experiment on this project's params.yaml:\n"
        f"#   dvc exp run {' '.join('-S ' + shlex.quote(a) for a in args)}\n"
        "# or: dvc exp run $(fedcomm sweep-args <this file>)\n"
    )
    return doc, head


def write_outputs(study: optuna.Study, sweep: Sweep, out_dir: Path, *, last_k: int) -> list[Path]:
    frame = trials_frame(study, sweep)
    written = [out_dir / "trials.parquet", out_dir / "pareto.png", out_dir / "history.png"]
    atomic.write_parquet(written[0], frame)
    plot_pareto(frame, sweep, written[1])
    plot_history(frame, sweep, written[2])
    best = best_trial(study, sweep)
    if best is not None:
        doc, head = best_params_doc(best, sweep)
        path = out_dir / "best_params.yaml"
        atomic.write_text(path, head + yaml.safe_dump(doc, sort_keys=False))
        written.append(path)
    summary = out_dir / "summary.md"
    atomic.write_text(summary, render_summary(frame, sweep, best, last_k=last_k))
    written.append(summary)
    return written


def _headers(sweep: Sweep) -> list[str]:
    """The objectives in words: the accuracy label, then the GiB objective if any."""
    comm = "Upload GiB" if sweep.objective.comm == "up" else "Total GiB (up + down)"
    return [sweep.objective.label, comm][: len(sweep.objective.names)]


def _table(frame: pl.DataFrame, sweep: Sweep) -> list[str]:
    names = sweep.objective.names
    keys = list(sweep.space)
    gib = (
        [] if sweep.objective.kind == "multi" and sweep.objective.comm == "total" else ["Total GiB"]
    )
    head = ["Trial", *_headers(sweep), *gib, *(f"`{k}`" for k in keys)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for row in frame.iter_rows(named=True):
        cells = [str(row["number"])]
        for i, n in enumerate(names):
            v = row.get(f"value:{n}")
            cells.append("–" if v is None else sweep.objective.shown(v) if i == 0 else f"{v:.4g}")
        if gib:
            total = row.get("total_gib")
            cells.append("–" if total is None else f"{total:.4g}")
        for k in keys:
            v = row.get(f"param:{k}")
            cells.append(f"{v:.4g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_summary(
    frame: pl.DataFrame, sweep: Sweep, best: FrozenTrial | None, *, last_k: int
) -> str:
    states = frame["state"].value_counts().sort("state") if frame.height else None
    counts = (
        ", ".join(f"{s.lower()} {c}" for s, c in states.iter_rows()) if states is not None else "-"
    )
    lines = [f"# Sweep `{sweep.study}`", ""]
    lines += [
        f"Run `{sweep.run}` of `{sweep.base}`, seeds {sweep.seeds}, objective "
        f"{' / '.join(_headers(sweep))} ({', '.join(sweep.objective.directions)}), "
        f"sampler {sweep.sampler.name}, pruner {sweep.active_pruner.name}. Trials: {counts}. "
        f"Final = the mean of each seed run's last {last_k} evaluations (`evaluate.last_k`), "
        "averaged over the trial's seeds.",
        "",
    ]
    if best is not None:
        got = ", ".join(
            f"{n} = {sweep.objective.shown(v)}" if i == 0 else f"{n} = {v:.4g}"
            for i, (n, v) in enumerate(zip(_headers(sweep), best.values, strict=True))
        )
        lines += [f"Best trial: **#{best.number}** ({got}); `best_params.yaml` has its values.", ""]
    done = frame.filter(pl.col("state") == "COMPLETE") if frame.height else frame
    if done.height:
        col = f"value:{sweep.objective.names[0]}"
        top = done.sort(col, descending=sweep.objective.maximize).head(10)
        lines += ["## Top trials", "", *_table(top, sweep), ""]
        front = done.filter(pl.col("pareto")).sort("total_gib")
        first = "accuracy up" if sweep.objective.maximize else "simulated hours down"
        lines += [f"## Pareto front ({first}, GiB down)", "", *_table(front, sweep), ""]
    lines += ["## Plots", "", "![Pareto front](pareto.png)", "", "![History](history.png)", ""]
    return "\n".join(lines)


def log_to_parent(
    uri: str | None,
    run_id: str,
    study: optuna.Study,
    sweep: Sweep,
    status: str,
    files: Sequence[Path] = (),
) -> None:
    """The study's outputs and best values on its parent MLflow run; the run ends with ``status``
    unless another worker still runs trials (the last worker to finish ends it)."""
    tr = tracking.reopen(uri, run_id)
    best = best_trial(study, sweep)
    finished, failed = counts(study)
    metrics = {"trials/finished": float(finished), "trials/failed": float(failed)}
    if best is not None:
        metrics |= {
            f"best/{n}": float(v) for n, v in zip(sweep.objective.names, best.values, strict=True)
        }
        metrics["best/trial"] = float(best.number)
    tr.log_metrics(metrics)
    for f in files:
        tr.log_artifact(f, "sweep")
    if not study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        tr.finish(status)
