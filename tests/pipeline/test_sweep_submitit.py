"""`fedcomm sweep --launcher submitit`: a study's trials as job-array tasks, through submitit's
local executor (each task a process of this machine, as Slurm would run it on a node), against a
real PostgreSQL study and an MLflow tracking server; and the launcher's stop when tasks die."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import optuna
import pytest
import yaml
from mlflow import MlflowClient

from tests.conftest import REPO
from tests.pipeline.servers import mlflow_server, postgres_server
from tests.pipeline.test_sweep import load, setup

pytestmark = pytest.mark.slow
TRIALS = 2  # one array of 2 tasks


def _sweep(project: Path, space: Path, *args: str, env: dict[str, str] | None = None) -> str:
    full = {**os.environ, "PYTHONPATH": str(REPO / "src"), "FEDCOMM_PROJECT_ROOT": str(project)}
    full.pop("MLFLOW_TRACKING_URI", None)
    proc = subprocess.run(
        [sys.executable, "-m", "fedcomm.cli", "sweep", str(space), "--launcher", "submitit",
         "--cluster", "local", *args],
        cwd=project, env={**full, **(env or {})}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    return f"{proc.returncode}\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.postgres
def test_trials_run_as_array_tasks_on_postgresql(project: Path, data_root: Path) -> None:
    with postgres_server() as pg:
        pg.create_database("optuna")
        pg.create_database("mlflow")
        artifacts = project / "mlartifacts-server"
        artifacts.mkdir()
        with mlflow_server(pg.url("mlflow"), artifacts) as tracking_uri:
            space = setup(project, "arr", trials=TRIALS, storage=pg.url("optuna"))
            base = yaml.safe_load((project / "base.yaml").read_text())
            base["tracking"] = {"uri": tracking_uri, "experiment": "unused"}
            (project / "base.yaml").write_text(yaml.safe_dump(base))
            out = _sweep(project, space, "--parallel", "2")
            assert out.startswith("0\n"), out[-3000:]
            assert f"study arr: {TRIALS} finished, 0 failed" in out

            study = optuna.load_study(study_name="arr", storage=pg.url("optuna"))
            trials = study.get_trials()
            assert len(trials) == TRIALS  # one task a trial: none extra
            assert {t.state.name for t in trials} == {"COMPLETE"}
            workers = {t.user_attrs["worker"] for t in trials}
            assert len(workers) == TRIALS  # each trial a task of its own (a process)
            tasks = list((project / ".fedcomm" / "submitit" / "arr").glob("*_result.pkl"))
            assert len(tasks) == TRIALS  # submitit's record of each finished task

            client = MlflowClient(tracking_uri)
            exp = client.get_experiment_by_name("sweep/arr")
            assert exp is not None
            runs = client.search_runs([exp.experiment_id], "tags.`fedcomm.study` = 'arr'")
            parents = [r for r in runs if r.data.tags["fedcomm.kind"] == "study"]
            trained = [r for r in runs if r.data.tags["fedcomm.kind"] == "train"]
            assert len(parents) == 1 and parents[0].info.status == "FINISHED"
            numbers = Counter(r.data.tags["optuna.trial_number"] for r in trained)
            assert numbers == Counter(str(t.number) for t in trials)  # exactly once each
            assert all(r.info.status == "FINISHED" for r in trained)
            assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in trained)
            report = project / "reports" / "sweep" / "arr"
            assert (report / "trials.parquet").is_file() and (report / "best_params.yaml").is_file()


def test_a_killed_task_stops_the_launcher_and_its_trial_is_requeued(
    project: Path, data_root: Path
) -> None:
    """A task dies after round 2 of 3 (journal storage, this host): with max_failures 1 the
    launcher fails the dead trial, re-queues it with its values (the next launch's task resumes
    it from its checkpoint, as any worker does: tests/pipeline/test_sweep.py) and stops with the
    error line and the study's table."""
    space = setup(project, "dead", trials=1, max_failures=1)
    out = _sweep(project, space, env={"FEDCOMM_KILL_AFTER_ROUND": "2"})
    assert out.startswith("1\n"), out[-3000:]
    assert "error: study 'dead': 1 trials failed in this run (max_failures=1)" in out
    trials = load(project, "dead").get_trials()
    assert [t.state.name for t in trials] == ["FAIL", "WAITING"]
    assert trials[1].user_attrs["retry_of"] == 0  # re-queued with the dead trial's values
    assert trials[1].system_attrs["fixed_params"] == trials[0].params
    assert (project / "reports" / "sweep" / "dead" / "trials.parquet").is_file()
