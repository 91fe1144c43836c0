"""``fedcomm sweep SPACE.yaml``: an Optuna study over the pipeline's own run function.

Each call is one *worker*: it creates the study (or joins it), runs trials in this process until
the study holds ``trials`` finished (complete or pruned) trials, then writes the study's outputs.
Start the same command on several shells or machines to run workers in parallel; re-run it to
continue an interrupted study. A trial that raises is recorded FAIL and the study goes on.

Storage (``storage`` in the space file): null = ``JournalStorage`` in ``.optuna/<study>.log``
under the project root (safe for parallel workers on one machine or NFS); an RDB URL (say
``postgresql+psycopg://user@host/db``) for workers on several machines, with Optuna's heartbeat
so a killed worker's trial is failed and retried. On the journal, a trial left RUNNING by a
dead process of this host is failed and re-queued by the next worker of this host (before each
of its trials). A retried trial works in the directory of the trial it retries, so on the same
host it resumes from that trial's checkpoint and finished seeds; its dead MLflow run is marked
FAILED unless the retry resumes it.

MLflow: the first worker (the one whose ``create_study`` succeeds) opens the study's parent run
(``fedcomm.kind: study``) and stores its id in the study's user attributes; every trial's run is
nested under it and its id is stored on the trial (``mlflow_run_id``). Outputs go to
``reports/sweep/<study>/``: ``trials.parquet``, ``pareto.png``, ``history.png``,
``best_params.yaml`` and ``summary.md``.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import zlib
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, fail_stale_trials
from optuna.storages import RetryHeartbeatStaleTrialCallback as RetryStale
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from fedcomm.atomic import file_lock
from fedcomm.config import ConfigError, Params
from fedcomm.errors import InputError
from fedcomm.paths import project_root
from fedcomm.sweep import outputs
from fedcomm.sweep.outputs import counts
from fedcomm.sweep.space import Sweep, load_sweep, trial_params
from fedcomm.sweep.trial import Pruned, TargetMissed, run_trial
from fedcomm.tracking import mlflow as tracking

PARENT_ATTR = "mlflow_parent_run_id"
FINGERPRINT_ATTR = "fedcomm_space_fingerprint"
HEARTBEAT_S = 30


class SweepFailed(RuntimeError):
    """Too many trials failed (``max_failures``); the outputs were still written."""


@dataclass(frozen=True)
class SweepResult:
    study: str
    finished: int
    failed: int
    outputs: list[Path]


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" where /proc is unavailable): with
    the pid it identifies a process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def worker_id(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def masked(url: str | None) -> str:
    """A storage URL with its password hidden (what logs and MLflow may show)."""
    if url is None or "://" not in url:
        return str(url)
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("://", 1)[0] + "://***"


def open_storage(url: str | None, study: str, root: Path) -> BaseStorage:
    """The study's storage: a journal file by default, an RDB (PostgreSQL) URL across machines."""
    if url is None or url.endswith(".log"):
        path = journal_path(url, study, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if url.startswith(("postgresql", "mysql", "sqlite")):
        for attempt in range(5):  # workers starting together race on creating a fresh schema
            try:
                return RDBStorage(
                    url,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=4 * HEARTBEAT_S,
                    failed_trial_callback=RetryStale(max_retry=2),
                )
            except Exception as err:
                if attempt == 4:
                    raise ConfigError(f"storage={masked(url)}: cannot open: {err}") from None
                time.sleep(1.0 + attempt)
    raise ConfigError(
        f"storage={masked(url)}: expected null (journal file), a path ending in .log, or an RDB "
        "URL (postgresql+psycopg://..., sqlite:///...)"
    )


def journal_path(url: str | None, study: str, root: Path) -> Path:
    return root / ".optuna" / f"{study}.log" if url is None else root / url


def _sampler(sweep: Sweep, joined: bool) -> optuna.samplers.BaseSampler:
    seed = sweep.sampler.seed if sweep.sampler.seed is not None else sweep.seeds[0]
    if joined:  # a second worker must not replay the creator's random start-up trials
        seed = (seed + zlib.crc32(worker_id().encode())) % 2**31
    if sweep.sampler.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if sweep.sampler.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _pruner(sweep: Sweep) -> optuna.pruners.BasePruner:
    """The warm-up rounds are applied per seed by the reporter (Optuna's ``n_warmup_steps``
    would count steps across seeds), so the pruners themselves start at step 0."""
    p = sweep.active_pruner
    if p.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials)
    if p.name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, p.warmup_rounds))
    return optuna.pruners.NopPruner()


def open_study(sweep: Sweep, storage: BaseStorage, fingerprint: str) -> tuple[optuna.Study, bool]:
    """Create the study, or join it; returns (study, created)."""
    name = sweep.study or "study"
    created = True
    try:
        optuna.create_study(study_name=name, storage=storage, directions=sweep.objective.directions)
    except optuna.exceptions.DuplicatedStudyError:
        created = False
    study = optuna.load_study(
        study_name=name,
        storage=storage,
        sampler=_sampler(sweep, joined=not created),
        pruner=_pruner(sweep),
    )
    got = [d.name.lower() for d in study.directions]
    if got != sweep.objective.directions:
        raise ConfigError(
            f"study {name!r} exists with directions {got}, the space asks for "
            f"{sweep.objective.directions}: rename the study (`study:`) or delete its storage"
        )
    if created:
        study.set_user_attr(FINGERPRINT_ATTR, fingerprint)
    return study, created


def fingerprint(sweep: Sweep, base_raw: dict[str, Any]) -> str:
    """The space and what of the base params reaches the tuned run (data, partition, model,
    train, evaluate and ``algorithms.<run>``): editing another algorithm's block, or applying
    the best values to ``params.yaml`` as a DVC experiment, does not change it."""
    params = trial_params(sweep, base_raw, {})
    relevant = params.model_dump(
        mode="json", include={"data", "partition", "model", "train", "evaluate"}
    )
    relevant["run"] = params.algorithm(sweep.run).model_dump(mode="json")
    space = sweep.fingerprint({})
    blob = json.dumps({"space": space, "base": relevant}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _wait_attr(study: optuna.Study, key: str, timeout_s: float = 120.0) -> Any:
    """A user attribute the creating worker sets right after creating the study."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = study.user_attrs.get(key)
        if value is not None or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def check_fingerprint(study: optuna.Study, expected: str) -> None:
    stored = _wait_attr(study, FINGERPRINT_ATTR)
    if stored is not None and stored != expected:
        raise ConfigError(
            f"study {study.study_name!r} was started from a different search space or base params "
            f"(fingerprint {stored} != {expected}): only `trials`, `storage`, `max_failures` and "
            "`experiment` may change when continuing a study; rename the study to start anew"
        )


def parent_run(study: optuna.Study, sweep: Sweep, base: Params, created: bool) -> str | None:
    """The study's MLflow run: opened by the creating worker, looked up (and marked RUNNING
    again, if a finished study is being extended) by the others."""
    if not base.tracking.enabled:
        return None
    if created or _wait_attr(study, PARENT_ATTR) is None:
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
    tracking.reopen(base.tracking.uri, parent).client.update_run(parent, status="RUNNING")
    return parent


def experiment_name(sweep: Sweep) -> str:
    return sweep.experiment or f"sweep/{sweep.study}"


def recover_stale(study: optuna.Study, lock: Path | None, uri: str | None) -> list[int]:
    """Fail and re-queue trials a dead process of this host left RUNNING; on an RDB storage also
    let Optuna's heartbeat fail stale trials of any host (they are re-queued by its retry
    callback). Returns the trial numbers this worker recovered."""
    if isinstance(study._storage, RDBStorage):  # the study's own storage
        fail_stale_trials(study)
    host, _, _ = worker_id().partition(":")
    recovered: list[int] = []
    with file_lock(lock) if lock is not None else nullcontext():
        for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker = str(t.user_attrs.get("worker", ""))
            name, _, rest = worker.partition(":")
            pid, _, started = rest.partition(":")
            if name != host or not pid.isdigit() or worker == worker_id():
                continue
            if _start_time(int(pid)) == started and started:  # that process still runs
                continue
            try:
                study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
            except UpdateFinishedTrialError:
                continue  # finished meanwhile, or another worker recovered it first
            root = int(t.user_attrs.get("retry_of", t.number))
            study.enqueue_trial(t.params, user_attrs={"retry_of": root}, skip_if_exists=False)
            run_id = t.user_attrs.get("mlflow_run_id")
            if run_id:  # resumed (RUNNING again) if the retry continues it on this host
                tracking.reopen(uri, str(run_id)).finish("FAILED")
            recovered.append(t.number)
    return recovered


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


def work_key(trial: optuna.Trial) -> int:
    """The first trial of this trial's retry chain (ours, or Optuna's heartbeat retries)."""
    ours = trial.user_attrs.get("retry_of")
    if ours is not None:
        return int(ours)
    system = trial.study._storage.get_trial_system_attrs(trial._trial_id)
    theirs = system.get("failed_trial")
    return int(theirs) if theirs is not None else trial.number


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
    objective = make_objective(sweep, base_raw, sweep_dir, parent)
    max_failures = sweep.max_failures or max(3, target)
    out_dir = reports or root / "reports" / "sweep" / study_name
    status, written = "FAILED", []
    finished = failed = 0
    try:
        recover_stale(study, lock, uri)
        finished, failed_before = counts(study)
        failed = failed_before
        while finished < target and failed - failed_before < max_failures:
            study.optimize(objective, n_trials=1, catch=(Exception,))
            recover_stale(study, lock, uri)
            finished, failed = counts(study)
        written = outputs.write_outputs(study, sweep, out_dir, base.evaluate.last_k)
        if finished < target:
            raise SweepFailed(
                f"study {study_name!r}: {failed - failed_before} trials failed in this run "
                f"(max_failures={max_failures}); their errors are in the `error` column of "
                f"{out_dir / 'trials.parquet'}"
            )
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if parent is not None:
            outputs.log_to_parent(uri, parent, study, sweep, status, written)
    return SweepResult(study_name, finished, failed, written)
