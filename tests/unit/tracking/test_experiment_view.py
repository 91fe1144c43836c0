"""What the MLflow UI shows first, checked through the MLflow API on real stores: experiments
tagged as model training (``mlflow.experimentKind``) and holding fedcomm's saved view, and each
training run's partition as its one dataset input (digest = the partition hash, context
``training``), also after a resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient
from mlflow.entities import DatasetInput

from fedcomm.config import Params
from fedcomm.errors import InputError
from fedcomm.stages.partition import partition_stage
from fedcomm.stages.paths import Paths
from fedcomm.stages.train import train_stage
from fedcomm.tracking import mlflow as tracking
from fedcomm.tracking.inputs import (
    CONTEXT,
    DIGEST_CHARS,
    SOURCE_TYPE,
    data_root_label,
    partition_input,
)
from fedcomm.tracking.views import VIEW_TAG
from tests.conftest import tiny_params

KIND = {tracking.KIND_TAG: tracking.MODEL_TRAINING}


@pytest.fixture
def params(store: Path) -> Params:
    """The tiny params (digits, 8 clients), 2 rounds, partitioned in ``project``."""
    p = Params.model_validate(tiny_params(**{"train.rounds": 2}))
    partition_stage(p)
    return p


def _manifest(root: Path) -> dict[str, Any]:
    return dict(json.loads((root / "data" / "partition" / "manifest.json").read_text()))


def _client(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def _tags(client: MlflowClient, name: str) -> dict[str, str]:
    """The experiment's tags but its saved view (``test_views.py``), whose presence is checked."""
    exp = client.get_experiment_by_name(name)
    assert exp is not None, name
    assert VIEW_TAG in exp.tags, name
    return {k: v for k, v in exp.tags.items() if k != VIEW_TAG}


def _datasets(client: MlflowClient, run_id: str) -> list[DatasetInput]:
    inputs = client.get_run(run_id).inputs
    return list(inputs.dataset_inputs) if inputs is not None else []


def test_a_training_run_names_its_partition(project: Path, params: Params) -> None:
    train_stage(params, "fedavg", 0, show_progress=False)
    client = _client(project)
    exp = client.get_experiment_by_name("tests")
    assert exp is not None and exp.tags[tracking.KIND_TAG] == "custom_model_development"
    (run,) = client.search_runs([exp.experiment_id])
    (only,) = _datasets(client, run.info.run_id)
    manifest = _manifest(project)
    ds = only.dataset
    assert ds.profile is not None
    assert ds.name == "digits / dirichlet 8"
    assert ds.digest == str(manifest["hash"])[:DIGEST_CHARS] == run.data.tags["partition_hash"][:12]
    assert ds.source_type == SOURCE_TYPE
    assert {t.key: t.value for t in only.tags} == {"mlflow.data.context": CONTEXT}
    profile = json.loads(ds.profile)
    assert profile["partition_hash"] == manifest["hash"]
    assert (profile["num_clients"], profile["num_rows"], profile["num_classes"]) == (8, 1797, 10)
    assert profile["partition"] == manifest["spec"]
    source = json.loads(ds.source)
    assert source == {
        "dataset": "digits",
        "dataset_fingerprint": manifest["dataset_fingerprint"],
        "data_root": data_root_label(None),
        "partition": "data/partition",
    }
    assert str(project) not in ds.source + ds.profile  # no path of this machine


def test_a_resumed_run_keeps_one_dataset_input(
    project: Path, params: Params, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a checkpoint resumes only under the same code: pinned, so an edit of the sources made
    # while the test runs cannot turn the resume into a restart
    monkeypatch.setattr("fedcomm.stages.train.code_fingerprint", lambda: "pinned")

    class Crash(Exception):
        pass

    def crash(round_: int, metrics: object) -> None:
        if round_ == 2:  # after round 1's checkpoint
            raise Crash

    with pytest.raises(Crash):
        train_stage(params, "fedavg", 0, show_progress=False, on_round=crash)
    client = _client(project)
    exp = client.get_experiment_by_name("tests")
    assert exp is not None
    (failed,) = client.search_runs([exp.experiment_id])
    assert failed.info.status == "FAILED" and len(_datasets(client, failed.info.run_id)) == 1

    out = train_stage(params, "fedavg", 0, show_progress=False)  # resumes the same MLflow run
    run_id = json.loads((out / "run.json").read_text())["mlflow_run_id"]
    assert run_id == failed.info.run_id
    assert client.get_run(run_id).info.status == "FINISHED"
    (only,) = _datasets(client, run_id)
    assert only.dataset.digest == str(_manifest(project)["hash"])[:DIGEST_CHARS]


def test_experiments_made_before_are_tagged_and_a_chosen_kind_is_kept(
    project: Path, params: Params
) -> None:
    client = _client(project)
    client.create_experiment("tests")  # as an older fedcomm left it: no kind
    client.create_experiment("genai", tags={tracking.KIND_TAG: "genai_development"})
    train_stage(params, "fedavg", 0, show_progress=False)
    assert _tags(client, "tests") == KIND

    tracking.init_store(None, "genai")  # a sweep's experiment: someone chose GenAI for it
    assert _tags(client, "genai") == {tracking.KIND_TAG: "genai_development"}
    tracking.init_store(None, "sweep/new")
    assert _tags(client, "sweep/new") == KIND


def test_reopening_an_older_run_tags_its_experiment(store: Path) -> None:
    """`fedcomm evaluate` (and a sweep's retried trial) reopen runs logged by older versions."""
    client = _client(store)
    exp_id = client.create_experiment("old")
    run_id = client.create_run(exp_id).info.run_id
    client.set_terminated(run_id)
    tracking.reopen(None, run_id)
    assert _tags(client, "old") == KIND


def test_an_inferred_kind_is_replaced(store: Path) -> None:
    client = _client(store)
    exp_id = client.create_experiment("x", tags={tracking.KIND_TAG: "genai_development_inferred"})
    assert tracking.mark_model_training(client, exp_id)
    assert client.get_experiment(exp_id).tags == KIND
    assert not tracking.mark_model_training(client, exp_id)  # once


def test_the_data_root_is_named_without_an_absolute_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("FEDCOMM_DATA_ROOT", raising=False)
    assert data_root_label(None) == ""
    monkeypatch.setenv("FEDCOMM_DATA_ROOT", str(tmp_path))
    assert data_root_label(None) == "$FEDCOMM_DATA_ROOT"
    assert data_root_label("") == "$FEDCOMM_DATA_ROOT"
    assert data_root_label("../shared/data") == "../shared/data"
    assert data_root_label(str(tmp_path)) == "data.root"


def test_a_damaged_manifest_is_named(project: Path, params: Params) -> None:
    manifest = project / "data" / "partition" / "manifest.json"
    good = _manifest(project)
    manifest.write_text(json.dumps({k: v for k, v in good.items() if k != "num_rows"}))
    with pytest.raises(InputError, match=r"manifest\.json: lacks num_rows \(written by another"):
        partition_input(Paths().partition, data_root=None)
    spec = {k: v for k, v in good["spec"].items() if k != "kind"}
    manifest.write_text(json.dumps({**good, "spec": spec}))
    with pytest.raises(InputError, match=r"manifest\.json: lacks spec\.kind \(written by"):
        partition_input(Paths().partition, data_root=None)
    manifest.write_text("{")
    with pytest.raises(InputError, match=r"manifest\.json: cannot be read \(JSONDecodeError\)"):
        partition_input(Paths().partition, data_root=None)


def test_runs_page_opens_the_model_training_view() -> None:
    assert tracking.runs_page("http://127.0.0.1:5000/", "7") == (
        "http://127.0.0.1:5000/#/experiments/7/runs?workflowType=machine_learning"
    )
