"""A sweep's MLflow runs, as the UI shows them: its experiment tagged as model training, and the
partition each trial trained on as the dataset input of the trial's run and of its seeds' runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.tracking import mlflow as tracking
from fedcomm.tracking.inputs import DIGEST_CHARS
from tests.pipeline.test_sweep import setup

pytestmark = pytest.mark.slow


def test_a_sweeps_trial_and_seed_runs_name_their_partition(project: Path) -> None:
    space = setup(project, "inputs", trials=1, seeds=[0, 1])  # 2 seeds: the trial has a run
    base = yaml.safe_load((project / "base.yaml").read_text())
    base["train"]["rounds"] = 1
    (project / "base.yaml").write_text(yaml.safe_dump(base))
    res = CliRunner().invoke(app, ["sweep", str(space)])
    assert res.exit_code == 0, (res.output, res.exception)

    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    exp = client.get_experiment_by_name("sweep/inputs")
    assert exp is not None and exp.tags[tracking.KIND_TAG] == tracking.MODEL_TRAINING
    runs = {r.info.run_id: r for r in client.search_runs([exp.experiment_id])}
    kinds = sorted(r.data.tags.get("fedcomm.kind", "") for r in runs.values())
    assert kinds == ["study", "train", "train", "trial"], kinds
    (manifest,) = project.glob("**/partitions/*/manifest.json")
    digest = json.loads(manifest.read_text())["hash"][:DIGEST_CHARS]
    for run in runs.values():
        inputs = run.inputs.dataset_inputs if run.inputs is not None else []
        if run.data.tags["fedcomm.kind"] == "study":  # trials may differ in their data
            assert inputs == []
            continue
        assert [(d.dataset.name, d.dataset.digest) for d in inputs] == [
            ("digits / dirichlet 8", digest)
        ], run.data.tags
