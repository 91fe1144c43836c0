"""A sweep's workers: who runs a trial, and recovery of the trials a dead worker left RUNNING.

A worker is one ``fedcomm sweep`` process, named ``host:pid:start`` by :func:`worker_id` (the
start time tells it from a later process that reuses its pid); each trial records its worker in
the ``worker`` user attribute. On the journal, a trial left RUNNING by a dead process of this
host is failed and re-queued by the next worker of this host (before each of its trials); on an
RDB storage, Optuna's heartbeat fails a killed worker's trial on any host and its retry callback
re-queues it. A retried trial works in the directory of the trial it retries (:func:`work_key`),
so on the same host it resumes from that trial's checkpoint and finished seeds; its dead MLflow
run is marked FAILED unless the retry resumes it.
"""

from __future__ import annotations

import os
import socket
from contextlib import nullcontext
from pathlib import Path

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import RDBStorage, fail_stale_trials
from optuna.trial import TrialState

from fedcomm.atomic import file_lock
from fedcomm.tracking import mlflow as tracking


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


def work_key(trial: optuna.Trial) -> int:
    """The first trial of this trial's retry chain (ours, or Optuna's heartbeat retries)."""
    ours = trial.user_attrs.get("retry_of")
    if ours is not None:
        return int(ours)
    system = trial.study._storage.get_trial_system_attrs(trial._trial_id)
    theirs = system.get("failed_trial")
    return int(theirs) if theirs is not None else trial.number
