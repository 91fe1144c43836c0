"""``fedcomm sweep SPACE.yaml``: an Optuna study over the pipeline's own run function.

Each call is one *worker*: it creates the study (or joins it), runs trials in this process until
the study holds ``trials`` finished (complete or pruned) trials, then writes the study's outputs.
Start the same command on several shells or machines to run workers in parallel; re-run it to
continue an interrupted study. A trial that raises is recorded FAIL and the study goes on. Where
the study is stored and how a worker opens it: :mod:`fedcomm.sweep.storage`; how the trials of a
dead worker are failed and retried: :mod:`fedcomm.sweep.workers`.

MLflow: the first worker (the one whose ``create_study`` succeeds) opens the study's parent run
(``fedcomm.kind: study``) and stores its id in the study's user attributes; every trial's run is
nested under it and its id is stored on the trial (``mlflow_run_id``). Outputs go to
``reports/sweep/<study>/``: ``trials.parquet``, ``pareto.png``, ``history.png``,
``best_params.yaml`` and ``summary.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import RDBStorage

from fedcomm.config import ConfigError, Params
from fedcomm.errors import InputError
from fedcomm.paths import project_root
from fedcomm.sweep import outputs
from fedcomm.sweep.outputs import counts
from fedcomm.sweep.space import Sweep, load_sweep, trial_params
from fedcomm.sweep.storage import (
    check_fingerprint,
    fingerprint,
    journal_path,
    masked,
    open_storage,
    open_study,
    wait_attr,
)
from fedcomm.sweep.trial import Pruned, TargetMissed, run_trial
from fedcomm.sweep.workers import recover_stale, work_key, worker_id
from fedcomm.tracking import mlflow as tracking

PARENT_ATTR = "mlflow_parent_run_id"


class SweepFailed(RuntimeError):
    """Too many trials failed (``max_failures``); the outputs were still written."""


@dataclass(frozen=True)
class SweepResult:
    study: str
    finished: int
    failed: int
    outputs: list[Path]


def parent_run(study: optuna.Study, sweep: Sweep, base: Params, created: bool) -> str | None:
    """The study's MLflow run: opened by the creating worker, looked up (and marked RUNNING
    again, if a finished study is being extended) by the others."""
    if not base.tracking.enabled:
        return None
    if created or wait_attr(study, PARENT_ATTR) is None:
        space = sweep.model_dump(mode="json")
        space["storage"] = masked(sweep.storage)
        run = tracking.open_run(
            uri=base.tracking.uri,
            experiment=experiment_name(sweep),
            run_name=f"study-{study.study_name}",
            tags={
                "fedcomm.kind": "study",
                "fedcomm.study": study.study_name,
                "run": sweep.run,
                "optuna.storage": masked(sweep.storage)
                if sweep.storage
                else f".optuna/{study.study_name}.log",
            },
            params={"space": space},
        )
        study.set_user_attr(PARENT_ATTR, run.run_id)
        return run.run_id
    parent: str = study.user_attrs[PARENT_ATTR]
    with tracking.whole_write():
        tracking.reopen(base.tracking.uri, parent).client.update_run(parent, status="RUNNING")
    return parent


def experiment_name(sweep: Sweep) -> str:
    return sweep.experiment or f"sweep/{sweep.study}"


def _suggest(trial: optuna.Trial, sweep: Sweep) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for key, dist in sweep.space.items():
        if dist.type == "float":
            low, high, log, step = dist.low, dist.high, dist.log, dist.step
            values[key] = trial.suggest_float(key, low, high, log=log, step=step)
        elif dist.type == "int":
            low_i, high_i = dist.low, dist.high
            values[key] = trial.suggest_int(key, low_i, high_i, log=dist.log, step=dist.step)
        else:
            values[key] = trial.suggest_categorical(key, dist.choices)
    return values


def max_rounds(sweep: Sweep, base_raw: dict[str, Any]) -> int:
    """An upper bound of a trial's rounds per seed (``train.rounds`` may be swept): the stride
    of the pruner's steps, so a step means the same (seed, round) in every trial."""
    dist = sweep.space.get("train.rounds")
    corners = dist.corners() if dist is not None else [None]
    most = 0
    for value in corners:
        params = trial_params(sweep, base_raw, {} if value is None else {"train.rounds": value})
        most = max(most, params.train.rounds + params.algorithm(sweep.run).extra_rounds())
    return most


def make_objective(
    sweep: Sweep, base_raw: dict[str, Any], sweep_dir: Path, parent_run_id: str | None
) -> Any:
    single = sweep.objective.kind == "single"
    warmup = sweep.active_pruner.warmup_rounds
    stride = max_rounds(sweep, base_raw)

    def objective(trial: optuna.Trial) -> float | list[float]:
        trial.set_user_attr("worker", worker_id())
        values = _suggest(trial, sweep)

        def reporter(seed_index: int, round_: int, value: float) -> bool:
            if not single:
                return False
            trial.report(value, seed_index * stride + round_)
            return round_ > warmup and trial.should_prune()

        try:
            result = run_trial(
                sweep,
                base_raw,
                values,
                sweep_dir=sweep_dir,
                number=trial.number,
                work_key=work_key(trial),
                parent_run_id=parent_run_id,
                reporter=reporter,
                on_run=lambda run_id: trial.set_user_attr("mlflow_run_id", run_id),
            )
        except TargetMissed as stop:  # time_to_target without penalty_h: say why in the table
            trial.set_user_attr("note", str(stop))
            raise optuna.TrialPruned(str(stop)) from None
        except Pruned as stop:
            raise optuna.TrialPruned(str(stop)) from None
        except Exception as err:  # recorded on the trial; Optuna marks it FAIL and goes on
            trial.set_user_attr("error", f"{type(err).__name__}: {err}"[:2000])
            raise
        for key, value in result.attrs.items():
            trial.set_user_attr(key, value)
        return result.values[0] if single else result.values

    return objective


@dataclass
class OpenStudy:
    """A worker's handle on its study, from :func:`open_sweep` to :func:`close_sweep`."""

    sweep: Sweep
    study: optuna.Study
    target: int  # finished trials to reach
    parent: str | None  # the study's MLflow run
    uri: str | None  # the tracking URI
    lock: Path | None  # the journal's recovery lock (None on an RDB)
    objective: Any
    max_failures: int
    out_dir: Path
    last_k: int
    failed_before: int = 0

    def recover(self) -> tuple[int, int]:
        """Trials dead workers left RUNNING failed and re-queued; then (finished, failed)."""
        recover_stale(self.study, self.lock, self.uri)
        return counts(self.study)


def open_sweep(
    space: Path,
    *,
    trials: int | None = None,
    root: Path | None = None,
    reports: Path | None = None,
) -> OpenStudy:
    """Create or join the study of ``space`` (its storage, its MLflow parent run, the check that
    it was started from this space), ready for trials."""
    root = root or project_root()
    sweep, base_raw = load_sweep(space, root)
    target = trials if trials is not None else sweep.trials
    study_name = sweep.study or space.stem
    expected = fingerprint(sweep, base_raw)
    experiment = experiment_name(sweep)
    base_raw = {**base_raw, "tracking": {**base_raw.get("tracking", {}), "experiment": experiment}}
    base = trial_params(sweep, base_raw, {})
    uri = base.tracking.uri
    if base.tracking.enabled:
        try:
            tracking.init_store(uri, experiment)
        except InputError:  # a damaged store: its own message names the file and the remedy
            raise
        except Exception as err:
            where = tracking.resolve_tracking_uri(uri)
            raise ConfigError(f"tracking.uri={where}: cannot open the store: {err}") from None
    storage = open_storage(sweep.storage, study_name, root)
    study, created = open_study(sweep, storage, expected)
    check_fingerprint(study, expected)
    parent = parent_run(study, sweep, base, created)
    lock = None
    if not isinstance(storage, RDBStorage):
        lock = journal_path(sweep.storage, study_name, root).with_suffix(".recover.lock")
    sweep_dir = root / ".fedcomm" / "sweeps" / study_name
    return OpenStudy(
        sweep, study, target, parent, uri, lock,
        make_objective(sweep, base_raw, sweep_dir, parent),
        sweep.max_failures or max(3, target),
        reports or root / "reports" / "sweep" / study_name,
        base.evaluate.last_k,
    )  # fmt: skip


def close_sweep(handle: OpenStudy, status: str) -> SweepResult:
    """The end of a worker: with ``status`` ``FINISHED`` the study's outputs written (also on
    its parent run); the parent run ends with ``status`` unless another worker still runs a
    trial; the counts. Raises :class:`SweepFailed` when fewer than the target finished."""
    finished, failed = counts(handle.study)
    written: list[Path] = []
    try:
        if status == "FINISHED":
            written = outputs.write_outputs(
                handle.study, handle.sweep, handle.out_dir, last_k=handle.last_k
            )
        if status == "FINISHED" and finished < handle.target:
            status = "FAILED"
            raise SweepFailed(
                f"study {handle.study.study_name!r}: {failed - handle.failed_before} trials "
                f"failed in this run (max_failures={handle.max_failures}); their errors are in "
                f"the `error` column of {handle.out_dir / 'trials.parquet'}"
            )
    finally:
        if handle.parent is not None:
            outputs.log_to_parent(
                handle.uri, handle.parent, handle.study, handle.sweep, status, written
            )
    return SweepResult(handle.study.study_name, finished, failed, written)


def run_sweep(
    space: Path,
    *,
    trials: int | None = None,
    root: Path | None = None,
    reports: Path | None = None,
) -> SweepResult:
    """Run this worker's share of the study in ``space``; write the outputs; return counts.

    Args:
        space: the search-space YAML.
        trials: overrides the space's ``trials`` (e.g. to extend a finished study).
        root: the project directory (base params, ``.optuna/``, ``.fedcomm/``); default the
            project root (``$FEDCOMM_PROJECT_ROOT`` or the working directory).
        reports: where outputs go; default ``<root>/reports/sweep/<study>``.
    """
    handle = open_sweep(space, trials=trials, root=root, reports=reports)
    status = "FAILED"
    try:
        finished, handle.failed_before = handle.recover()
        failed = handle.failed_before
        while finished < handle.target and failed - handle.failed_before < handle.max_failures:
            one_trial(handle)
            finished, failed = handle.recover()
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if status != "FINISHED":  # (an error or Ctrl-C: the outputs so far, the run ended)
            close_sweep(handle, status)
    return close_sweep(handle, status)


def one_trial(handle: OpenStudy) -> None:
    """One trial of the study in this process (a trial that raises is recorded FAIL)."""
    handle.study.optimize(handle.objective, n_trials=1, catch=(Exception,))
