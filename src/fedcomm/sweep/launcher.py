"""``fedcomm sweep SPACE --launcher submitit``: a study's trials as job-array tasks (Slurm).

The launching process creates or joins the study (its storage, its MLflow parent run, the
fingerprint check: :func:`~fedcomm.sweep.study.open_sweep`), then submits one job array with a
task per trial still missing (``target - finished``); each task is a worker that runs **one**
trial (:func:`array_task`) against the same storage and MLflow store, and ends. It waits for the
array, fails and re-queues the trials of tasks that died (Optuna's heartbeat on PostgreSQL; on a
journal file, :func:`~fedcomm.sweep.workers.recover_stale` for this host's tasks: the retry works
in the dead trial's directory, so it resumes from its checkpoint), and submits another array for
what is still missing, until the study holds ``target`` finished trials or
``max_failures`` trials (or tasks) failed; then it writes the study's outputs and ends the parent
run, as a local worker does.

The executor is submitit's: ``cluster`` ``slurm`` (``sbatch``), ``local`` (each task a process on
this machine: what the tests run), ``debug`` (in this process), or ``None`` (Slurm where
``sbatch`` exists, else local). Every task needs the study's storage and the MLflow store from
its node: PostgreSQL (or a journal file on a shared file system) and a tracking server (or a
file store on a shared file system; never a sqlite file over NFS).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedcomm.errors import InputError
from fedcomm.paths import project_root
from fedcomm.sweep.study import OpenStudy, SweepResult, close_sweep, one_trial, open_sweep

log = logging.getLogger(__name__)

CLUSTERS = ("slurm", "local", "debug")


@dataclass(frozen=True)
class Cluster:
    """Where and how the array's tasks run (submitit's executor parameters)."""

    cluster: str | None = None  # None: slurm where sbatch exists, else local
    folder: Path | None = None  # submitit's job files and logs (default .fedcomm/submitit/<study>)
    parallel: int = 4  # tasks running at once (Slurm's array parallelism; elsewhere: waves)
    timeout_min: int = 60  # a task's wall-clock limit
    partition: str | None = None
    cpus_per_task: int = 1
    gpus_per_task: int = 0
    mem_gb: float | None = None
    slurm: dict[str, Any] = field(default_factory=dict)  # any other slurm_<key> (e.g. account)

    def __post_init__(self) -> None:
        if self.cluster is not None and self.cluster not in CLUSTERS:
            raise InputError(f"--cluster: {self.cluster!r} is not one of {list(CLUSTERS)}")
        for name in ("parallel", "timeout_min", "cpus_per_task"):
            if getattr(self, name) < 1:
                raise InputError(f"--{name.replace('_', '-')}: must be >= 1")


def array_task(space: str, root: str, trials: int | None) -> tuple[int, int]:
    """One job-array task: a worker of the study that runs one trial, then ends (the launcher
    writes the outputs). Returns the study's (finished, failed) after it."""
    handle = open_sweep(Path(space), trials=trials, root=Path(root))
    finished, _ = handle.recover()
    if finished < handle.target:
        one_trial(handle)
    return handle.recover()


def executor(cluster: Cluster, folder: Path) -> Any:
    """submitit's executor for ``cluster``, its parameters set."""
    try:
        import submitit
    except ModuleNotFoundError:
        raise InputError(
            "--launcher submitit needs submitit: pip install 'fedcomm[cluster]'"
        ) from None

    ex = submitit.AutoExecutor(folder=folder, cluster=cluster.cluster)
    params: dict[str, Any] = {"timeout_min": cluster.timeout_min}
    if ex.cluster == "slurm":
        params |= {
            "slurm_array_parallelism": cluster.parallel,
            "cpus_per_task": cluster.cpus_per_task,
            **({"slurm_partition": cluster.partition} if cluster.partition else {}),
            **({"gpus_per_node": cluster.gpus_per_task} if cluster.gpus_per_task else {}),
            **({"mem_gb": cluster.mem_gb} if cluster.mem_gb else {}),
            **{f"slurm_{k}": v for k, v in cluster.slurm.items()},
        }
    ex.update_parameters(**params)
    return ex


def launch(
    space: Path,
    cluster: Cluster,
    *,
    trials: int | None = None,
    root: Path | None = None,
    reports: Path | None = None,
) -> SweepResult:
    """Run the study of ``space`` as job arrays on ``cluster`` until it holds its target of
    finished trials (see the module docstring); write the outputs; return the counts."""
    root = (root or project_root()).resolve()
    handle = open_sweep(space, trials=trials, root=root, reports=reports)
    folder = cluster.folder or root / ".fedcomm" / "submitit" / handle.study.study_name
    ex = executor(cluster, folder)
    status = "FAILED"
    try:
        finished, handle.failed_before = handle.recover()
        _waves(handle, ex, str(space.resolve()), str(root), trials, finished, cluster.parallel)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if status != "FINISHED":
            close_sweep(handle, status)
    return close_sweep(handle, status)


def _waves(
    handle: OpenStudy,
    ex: Any,
    space: str,
    root: str,
    trials: int | None,
    finished: int,
    parallel: int,
) -> None:
    """Job arrays of the missing trials until the target is met or too many failed."""
    lost = 0  # tasks that ended without a result (killed, out of time, an error outside a trial)
    failed = handle.failed_before
    while finished < handle.target:
        # (a killed task's trial is also a failed trial once recovered: the larger count rules)
        if max(failed - handle.failed_before, lost) >= handle.max_failures:
            return  # close_sweep says how many failed
        missing = handle.target - finished
        if ex.cluster != "slurm":  # (Slurm caps the running tasks itself; locally: waves)
            missing = min(missing, parallel)
        jobs = ex.map_array(array_task, [space] * missing, [root] * missing, [trials] * missing)
        log.info("submitted %d task(s) as job array %s", missing, jobs[0].job_id.split("_")[0])
        for job in jobs:
            try:
                job.result()
            except Exception as err:  # the task died: its trial (if any) is recovered below
                lost += 1
                log.warning("task %s ended without a result: %s", job.job_id, str(err)[:300])
        finished, failed = handle.recover()
