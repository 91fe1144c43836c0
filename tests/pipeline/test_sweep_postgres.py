"""The multi-machine path for real: Optuna on PostgreSQL, MLflow as a tracking server on a
PostgreSQL backend store, two `fedcomm sweep` worker processes on one study. Every trial must be
recorded exactly once in Optuna and exactly once in MLflow."""

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
from tests.pipeline.test_sweep import setup

pytestmark = [pytest.mark.slow, pytest.mark.postgres]
TRIALS = 8  # of 6 rounds each: long enough that both workers join


def test_two_workers_share_one_study_on_postgresql(project: Path, data_root: Path) -> None:
    with postgres_server() as pg:
        pg.create_database("optuna")
        pg.create_database("mlflow")
        artifacts = project / "mlartifacts-server"
        artifacts.mkdir()
        with mlflow_server(pg.url("mlflow"), artifacts) as tracking_uri:
            space = setup(project, "pg", trials=TRIALS, storage=pg.url("optuna"))
            base = yaml.safe_load((project / "base.yaml").read_text())
            base["tracking"] = {"uri": tracking_uri, "experiment": "unused"}
            base["train"]["rounds"] = 6
            (project / "base.yaml").write_text(yaml.safe_dump(base))
            env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
            env["FEDCOMM_PROJECT_ROOT"] = str(project)
            env.pop("MLFLOW_TRACKING_URI", None)
            workers = [
                subprocess.Popen(
                    [sys.executable, "-m", "fedcomm.cli", "sweep", str(space)],
                    cwd=project,
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for _ in range(2)
            ]
            outputs = [w.communicate(timeout=600)[0] for w in workers]
            for w, out in zip(workers, outputs, strict=True):
                assert w.returncode == 0, out[-3000:]

            study = optuna.load_study(study_name="pg", storage=pg.url("optuna"))
            trials = study.get_trials()
            # each worker checks the count before it starts a trial: at most one extra
            assert TRIALS <= len(trials) <= TRIALS + 1
            assert {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}  # none failed
            assert len({t.user_attrs["worker"] for t in trials}) == 2  # both workers ran trials

            client = MlflowClient(tracking_uri)
            exp = client.get_experiment_by_name("sweep/pg")
            assert exp is not None
            runs = client.search_runs([exp.experiment_id], "tags.`fedcomm.study` = 'pg'")
            parents = [r for r in runs if r.data.tags["fedcomm.kind"] == "study"]
            trained = [r for r in runs if r.data.tags["fedcomm.kind"] == "train"]
            assert len(parents) == 1  # one study run although two workers started together
            assert parents[0].info.status == "FINISHED"  # ended by the last worker
            assert study.user_attrs["mlflow_parent_run_id"] == parents[0].info.run_id
            numbers = Counter(r.data.tags["optuna.trial_number"] for r in trained)
            assert numbers == Counter(str(t.number) for t in trials)  # exactly once each
            ids = {r.info.run_id: r for r in trained}
            assert sorted(ids) == sorted(t.user_attrs["mlflow_run_id"] for t in trials)
            for t in trials:
                run = ids[t.user_attrs["mlflow_run_id"]]
                pruned = t.state.name == "PRUNED"
                assert run.info.status == ("KILLED" if pruned else "FINISHED")
                assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
                assert run.data.tags["optuna.trial_number"] == str(t.number)
            done = next(r for r in trained if r.info.status == "FINISHED")
            files = {a.path for a in client.list_artifacts(done.info.run_id)}
            assert "model.safetensors" in files  # proxied to the server's artifact store
            assert any(artifacts.rglob("model.safetensors"))
