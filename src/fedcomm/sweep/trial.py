"""One sweep trial: train the sampled configuration for each seed, in process, and score it.

A trial reuses the pipeline's own stages (:func:`~fedcomm.stages.train.train_stage` and
:func:`~fedcomm.stages.evaluate.evaluate_stage`), so a trial's numbers are exactly what
``dvc repro`` would produce for the same params. Its files live in a work directory keyed by the
sampled values and seeds, so a trial retried after a crash resumes from the crashed one's
checkpoint.

MLflow: with one seed the training run *is* the trial's run (nested under the study's run);
with several seeds a trial run (``fedcomm.kind: trial``) holds the mean objective and each seed's
training run is nested under it.
"""

from __future__ import annotations

import json
import math
import shutil
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from fedcomm.atomic import file_lock
from fedcomm.comm.bits import GIB
from fedcomm.config import Params
from fedcomm.data.federated import partition_hash
from fedcomm.evaluation.curve_points import (
    best_value,
    best_within_budget,
    final_value,
    last_value,
)
from fedcomm.evaluation.sim_time import (
    HOUR_S,
    SIM_ELAPSED,
    best_within_time,
    has_sim_time,
    sim_hours_to_target,
)
from fedcomm.evaluation.summaries import run_table
from fedcomm.stages.evaluate import evaluate_stage
from fedcomm.stages.identity import resolved_run_config
from fedcomm.stages.partition import load_data, partition_spec, partition_stage
from fedcomm.stages.paths import Paths
from fedcomm.stages.train import StopRun, train_stage
from fedcomm.sweep.space import Objective, Sweep, trial_params
from fedcomm.tracking import mlflow as tracking
from fedcomm.tracking.inputs import partition_input

# what :func:`score` reports besides the objectives (trial attributes, mean over seeds)
DETAIL_KEYS = (
    "final_global_accuracy",  # final = the mean of the last evaluate.last_k evaluations
    "best_global_accuracy",
    "final_local_accuracy",
    "total_gib",
    "up_gib",
    "sparsity",
)
# (seed index, round, intermediate objective) -> True to stop the trial (pruned)
Reporter = Callable[[int, int, float], bool]


class Pruned(StopRun):
    """The pruner stopped the trial at ``round_`` (its MLflow runs end KILLED)."""

    def __init__(self, round_: int, reason: str | None = None) -> None:
        super().__init__(reason or f"pruned by the sweep's pruner after round {round_}")
        self.round_ = round_


class TargetMissed(Pruned):
    """``reduce: time_to_target`` without ``penalty_h``: a seed finished without reaching the
    target, so the trial has no time to report and is pruned (Optuna's samplers rank a pruned
    trial below every completed one)."""

    def __init__(self, round_: int, seed: int, objective: Objective) -> None:
        super().__init__(
            round_,
            f"seed {seed} never reached {objective.metric} >= {objective.target:g} in "
            f"{round_} rounds (objective {objective.names[0]}; set objective.penalty_h to count "
            "such seeds instead of pruning)",
        )


@dataclass
class TrialResult:
    """The trial's objective values (means over seeds) and what the trials table shows."""

    values: list[float]
    attrs: dict[str, Any] = field(default_factory=dict)


def prepare_partition(params: Params, sweep_dir: Path) -> tuple[Path, str]:
    """The trial's partition, shared by every trial with the same data and partition params
    (written once, under a lock, by whichever worker needs it first)."""
    phash = partition_hash(load_data(params).fingerprint(), partition_spec(params))
    where = sweep_dir / "partitions" / phash[:16]
    with file_lock(sweep_dir / "partitions" / f".{phash[:16]}.lock"):
        partition_stage(params, Paths(partition=where))
    return where, phash


class Intermediate:
    """The objective's running value from the per-round metrics (what the pruner sees)."""

    def __init__(self, objective: Objective, last_k: int) -> None:
        self.objective = objective
        # ``final``: the mean of the last ``last_k`` evaluations so far (evaluate.last_k)
        self.recent: deque[float] = deque(maxlen=last_k)
        self.value: float | None = None
        self.reached = False  # time_to_target: the target was reached (value fixed)

    def update(self, metrics: Mapping[str, float | None]) -> float | None:
        """Fold in one round; returns the running value if this round evaluated the metric.

        ``time_to_target``: the simulated hours once the target is reached, and before that
        the hours elapsed so far (a lower bound of the final value, minimized like it).
        """
        v = metrics.get(self.objective.metric)
        if v is None or math.isnan(v):
            return None
        reduce = self.objective.reduce
        if reduce == "final":
            self.recent.append(v)
            self.value = sum(self.recent) / len(self.recent)
        elif reduce == "best":
            self.value = v if self.value is None else max(self.value, v)
        elif reduce == "time_to_target":
            self.value = self._time_to_target(v, metrics)
        else:
            if reduce == "at_budget":
                spent, budget = metrics.get("comm/cum_gib") or 0.0, self.objective.budget_gib
            else:
                spent, budget = _elapsed_h(metrics), self.objective.budget_h
            if spent <= (budget or 0.0):
                self.value = v if self.value is None else max(self.value, v)
            elif self.value is None:
                self.value = 0.0  # the first evaluation already exceeds the budget
        return self.value

    def _time_to_target(self, v: float, metrics: Mapping[str, float | None]) -> float:
        if self.reached:
            return self.value or 0.0
        self.reached = v >= (self.objective.target or 0.0)
        return _elapsed_h(metrics)


def _elapsed_h(metrics: Mapping[str, float | None]) -> float:
    """Simulated hours after this round (``time/sim_elapsed_s`` / 3600)."""
    elapsed = metrics.get(SIM_ELAPSED)
    if elapsed is None or math.isnan(elapsed):
        raise ValueError(
            f"round metrics have no {SIM_ELAPSED}: a simulated-time objective needs the "
            "params' `system` section"
        )
    return elapsed / HOUR_S


def score(
    table: pl.DataFrame, objective: Objective, seed: int = 0, *, last_k: int
) -> tuple[float, float, dict[str, Any]]:
    """(first objective, GiB objective, details) of one finished run's :func:`run_table`.

    ``final`` (the objective's reduce and the details' ``final_*``) is the mean of the run's last
    ``last_k`` evaluations (``evaluate.last_k``, as every fedcomm table).

    At a budget no evaluation fits in, the accuracy is 0 (and ``details['note']`` says so).
    ``time_to_target``: the simulated hours to reach the target; a run that never does counts
    ``objective.penalty_h`` (noted), or raises :class:`TargetMissed` without one.
    """
    m = objective.metric
    details: dict[str, Any] = {}
    if objective.sim_time and not has_sim_time(table):
        raise ValueError(
            f"objective {objective.names[0]} reads {SIM_ELAPSED}, which the run did not "
            "record (its params need a `system` section)"
        )
    if objective.reduce == "final":
        acc = final_value(table, m, last_k)
    elif objective.reduce == "best":
        acc = best_value(table, m)[0]
    elif objective.reduce == "time_to_target":
        if last_value(table, m) is None:
            raise ValueError(f"the run never measured {m} (check train.eval_every / evaluation)")
        acc = sim_hours_to_target(table, m, objective.target or 0.0)
        if acc is None and objective.penalty_h is None:
            raise TargetMissed(int(table["round"][-1]), seed, objective)
        if acc is None:
            details["note"] = (
                f"target {objective.target:g} not reached: counted penalty_h = "
                f"{objective.penalty_h:g} h"
            )
            acc = objective.penalty_h
    else:
        if objective.reduce == "at_budget":
            acc, within = best_within_budget(table, m, objective.budget_gib or 0.0), "GiB"
            limit = objective.budget_gib
        else:
            acc, within = best_within_time(table, m, objective.budget_h or 0.0), "simulated h"
            limit = objective.budget_h
        if acc is None:
            details["note"] = f"no evaluation within {limit} {within}"
            acc = 0.0
    if acc is None:
        raise ValueError(f"the run never measured {m} (check train.eval_every / evaluation)")
    up = float(table["cum_up_bytes"][-1]) / GIB if table.height else 0.0
    total = float(table["cum_gib"][-1]) if table.height else 0.0
    gib = total if objective.comm == "total" else up
    details |= {
        "final_global_accuracy": final_value(table, "global/accuracy", last_k),
        "best_global_accuracy": best_value(table, "global/accuracy")[0],
        "final_local_accuracy": final_value(table, "local/accuracy", last_k),
        "total_gib": total,
        "up_gib": up,
        "sparsity": last_value(table, "model/sparsity"),
    }
    if has_sim_time(table):
        details["sim_elapsed_h"] = last_value(table, SIM_ELAPSED) / HOUR_S  # type: ignore[operator]
    return acc, gib, details


def run_trial(
    sweep: Sweep,
    base_raw: dict[str, Any],
    values: dict[str, Any],
    *,
    sweep_dir: Path,
    number: int,
    work_key: int,
    parent_run_id: str | None,
    reporter: Reporter | None = None,
    on_run: Callable[[str], None] | None = None,
) -> TrialResult:
    """Train and score ``values`` over the sweep's seeds.

    Args:
        sweep: the validated search space.
        base_raw: the base params mapping.
        values: the sampled values (dotted params keys).
        sweep_dir: the study's work directory (partitions, trial directories, checkpoints).
        number: the Optuna trial number (a tag on the MLflow runs).
        work_key: names the trial's work directory: the number of the first trial of a retry
            chain, so a retry resumes from the dead trial's checkpoints and finished seeds.
        parent_run_id: the study's MLflow run (None: tracking off).
        reporter: called with ``(seed index, round, value)`` at every evaluated round;
            returning True prunes the trial (:class:`Pruned`).
        on_run: called with the trial's MLflow run id as soon as it exists.

    Returns:
        The objective values (mean over seeds) and the trial's attributes.
    """
    params = trial_params(sweep, base_raw, values)
    partition, phash = prepare_partition(params, sweep_dir)
    work = sweep_dir / "trials" / f"{work_key:05d}"
    paths = Paths(partition=partition, runs=work / "runs", checkpoints=work / "checkpoints")
    tracked = params.tracking.enabled and parent_run_id is not None
    tags = {"fedcomm.study": sweep.study or "", "optuna.trial_number": str(number)}
    parent = parent_run_id if tracked else None
    trial_run = None
    if tracked and len(sweep.seeds) > 1:
        trial_run = tracking.open_run(
            uri=params.tracking.uri,
            experiment=params.tracking.experiment,
            run_name=f"trial-{number}",
            tags={**tags, "fedcomm.kind": "trial", "run": sweep.run},
            params={"values": values, "seeds": list(sweep.seeds)},
            parent_run_id=parent_run_id,
            dataset=partition_input(partition, data_root=params.data.root),  # its seeds' data
        )
        parent = trial_run.run_id
        if on_run is not None:
            on_run(trial_run.run_id)
    per_seed: list[dict[str, Any]] = []
    try:
        for i, seed in enumerate(sweep.seeds):
            run_id = _finished_seed(params, sweep.run, seed, phash, paths)
            if run_id is None:
                run_id = _train_seed(
                    params, sweep, seed, i, paths, parent, tags, reporter, trial_run, on_run
                )
                evaluate_stage(params, sweep.run, seed, paths)
            elif run_id and tracked:  # a retry reuses the dead trial's finished seed run
                tracking.reopen(params.tracking.uri, run_id).set_tags(
                    {**tags, tracking.PARENT_TAG: parent or ""}
                )
            out = paths.train_dir(sweep.run, seed)
            table = run_table(
                pl.read_parquet(out / "rounds.parquet"),
                pl.read_parquet(out / "ledger.parquet"),
                pl.read_parquet(out / "clients.parquet"),
            )
            acc, gib, details = score(table, sweep.objective, seed, last_k=params.evaluate.last_k)
            per_seed.append(
                {
                    "seed": seed,
                    "mlflow_run_id": run_id or None,
                    "accuracy": acc,
                    "gib": gib,
                    **details,
                }
            )
    except Pruned as stop:
        shutil.rmtree(paths.checkpoints, ignore_errors=True)  # a pruned trial is never resumed
        if trial_run is not None:
            trial_run.set_tags({"fedcomm.stopped": str(stop)})
            trial_run.finish("KILLED")
        raise
    except KeyboardInterrupt:  # Ctrl-C: KILLED, as its training run and the study's run
        if trial_run is not None:
            trial_run.finish("KILLED")
        raise
    except BaseException:
        if trial_run is not None:
            trial_run.finish("FAILED")
        raise
    values_out = [sum(s["accuracy"] for s in per_seed) / len(per_seed)]
    if sweep.objective.kind == "multi":
        values_out.append(sum(s["gib"] for s in per_seed) / len(per_seed))
    attrs = _mean_details(per_seed)
    attrs["per_seed"] = per_seed
    attrs["workdir"] = str(work)
    if trial_run is not None:
        names = sweep.objective.names
        trial_run.log_metrics(
            {f"objective/{n}": v for n, v in zip(names, values_out, strict=False)}
            | {f"mean/{k}": v for k, v in attrs.items() if isinstance(v, float)}
        )
        trial_run.finish("FINISHED")
    return TrialResult(values_out, attrs)


def _finished_seed(params: Params, run: str, seed: int, phash: str, paths: Paths) -> str | None:
    """The MLflow run id ("" if untracked) of a seed this work directory already trained and
    evaluated with exactly this configuration, else None."""
    info = paths.train_dir(run, seed) / "run.json"
    if not (info.is_file() and (paths.run_dir(run, seed) / "summary.json").is_file()):
        return None
    stored = json.loads(info.read_text())
    if stored.get("config") != resolved_run_config(params, run, seed, phash):
        return None
    return str(stored.get("mlflow_run_id") or "")


def _train_seed(
    params: Params,
    sweep: Sweep,
    seed: int,
    index: int,
    paths: Paths,
    parent: str | None,
    tags: dict[str, str],
    reporter: Reporter | None,
    trial_run: tracking.MlflowTracker | None,
    on_run: Callable[[str], None] | None,
) -> str:
    """Train one seed (resuming its checkpoint if any); returns its MLflow run id ("" if none)."""
    running = Intermediate(sweep.objective, params.evaluate.last_k)
    opened: list[str] = []

    def on_round(round_: int, metrics: Mapping[str, float | None]) -> None:
        value = running.update(metrics)
        if value is not None and reporter is not None and reporter(index, round_, value):
            raise Pruned(round_)

    def on_open(run_id: str) -> None:
        opened.append(run_id)
        if trial_run is None and on_run is not None:
            on_run(run_id)

    train_stage(
        params,
        sweep.run,
        seed,
        paths,
        show_progress=False,
        parent_run_id=parent,
        tags=tags,
        on_round=on_round,
        on_open=on_open,
        mlflow_run_name=f"trial-{tags['optuna.trial_number']}-s{seed}",
    )
    return opened[0] if opened else ""


def _mean_details(per_seed: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in DETAIL_KEYS:
        vals = [float(s[k]) for s in per_seed if isinstance(s.get(k), int | float)]
        out[k] = sum(vals) / len(vals) if vals else None
    sim = [float(s["sim_elapsed_h"]) for s in per_seed if "sim_elapsed_h" in s]
    if sim:  # runs with a `system` section: their simulated hours
        out["sim_elapsed_h"] = sum(sim) / len(sim)
    notes = sorted({s["note"] for s in per_seed if "note" in s})
    if notes:
        out["note"] = "; ".join(notes)
    return out
