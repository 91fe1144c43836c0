"""``fedcomm.load_model`` on runs trained by the real train stage (digits, 4 rounds of 3 local
epochs): a dense MLP, a tiny CNN, FedDST's sparse MLP, FedSparse's CNN, ProgFed's grown MLP and
FedAvg-MoG's ensemble, from their run folders, their model files and their MLflow runs. The loaded
module predicts what the run logged (its final global accuracy, bit for bit) and holds the file's
zeros."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch
import yaml
from mlflow import MlflowClient
from safetensors import safe_open
from torch import nn

import fedcomm
from fedcomm.config import Params
from fedcomm.errors import InputError
from fedcomm.evaluation.rebuild import Ensemble, ModelLoadError
from fedcomm.sparse_io import load_sparse
from fedcomm.stages.partition import load_federated, partition_stage
from fedcomm.stages.paths import Paths
from fedcomm.stages.train import train_stage
from tests.conftest import REPO, tiny_params

CNN = {"name": "mnist_cnn", "channels": [4, 8], "hidden": 16}
#: run -> (algorithm, model); the runs of one params file share the MLP unless they say
RUNS: dict[str, tuple[dict[str, Any], dict[str, Any] | None]] = {
    "fedavg": ({"name": "fedavg", "server": {"optimizer": "sgd", "lr": 1.0}}, None),
    "feddst": ({"name": "feddst", "sparsity": 0.8}, None),
    "progfed": ({"name": "progfed"}, None),
    "mog": ({"name": "fedavg_mog"}, None),
    "cnn": ({"name": "fedavg", "server": {"optimizer": "sgd", "lr": 1.0}}, CNN),
    "fedsparse": ({"name": "fedsparse", "server": {"optimizer": "sgd"}}, CNN),
}


def _params(model: dict[str, Any] | None) -> dict[str, Any]:
    runs = [r for r, (_, m) in RUNS.items() if m == model]
    raw = tiny_params(
        **{
            "train.rounds": 4,
            "train.local.epochs": 3,
            "train.local.lr": 0.3,
            "experiment.runs": runs,
        }
    )
    raw["algorithms"] = {r: RUNS[r][0] for r in runs}
    if model is not None:
        raw["model"] = model
    return raw


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A project whose runs (``runs/<run>-s0``) were trained by the train stage, with MLflow."""
    root = tmp_path_factory.mktemp("project")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("FEDCOMM_PROJECT_ROOT", str(root))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        for model in (None, CNN):
            raw = _params(model)
            (root / "params.yaml").write_text(yaml.safe_dump(raw))  # the CNN's last
            params = Params.model_validate(raw)
            partition_stage(params)
            for run in raw["experiment"]["runs"]:
                train_stage(params, run, 0, show_progress=False)
        yield root


@pytest.fixture
def in_project(trained: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(trained)
    monkeypatch.setenv("FEDCOMM_PROJECT_ROOT", str(trained))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return trained


def _test_accuracy(model: nn.Module, run: str) -> float:
    """``model``'s accuracy on the union of the clients' test splits (what the run evaluates)."""
    data, _ = load_federated(Params.model_validate(_params(RUNS[run][1])), Paths())
    pool = data.global_test
    with torch.no_grad():
        correct = model(pool.x).argmax(-1) == pool.y
    if data.union_rows is not None:
        correct = correct[data.union_rows]
    return float(correct.double().mean())


def _logged_accuracy(project: Path, run: str) -> float:
    rounds = pl.read_parquet(project / "runs" / f"{run}-s0" / "train" / "rounds.parquet")
    return float(rounds["global/accuracy"][-1])


def _same_tensors(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


@pytest.mark.parametrize("run", list(RUNS))
def test_a_runs_model_predicts_what_the_run_logged(in_project: Path, run: str) -> None:
    model = fedcomm.load_model(in_project / "runs" / f"{run}-s0")
    assert not model.training and all(p.device.type == "cpu" for p in model.parameters())
    logged = _logged_accuracy(in_project, run)
    assert logged > 0.25  # trained: well above chance (0.1), so the check means something
    assert _test_accuracy(model, run) == pytest.approx(logged, abs=1e-12)


@pytest.mark.parametrize("run", ["feddst", "fedsparse"])
def test_the_sparse_weights_are_in_place(in_project: Path, run: str) -> None:
    """Every saved tensor is in the module exactly (zeros where the file's bitmap has a 0 bit)."""
    path = in_project / "runs" / f"{run}-s0" / "train" / "model.safetensors"
    model = fedcomm.load_model(path)
    state = model.state_dict()
    saved = load_sparse(path)
    for name, t in saved.items():
        assert torch.equal(state[name], t), name
    with safe_open(str(path), framework="pt") as f:
        layout = json.loads(f.metadata()["fedcomm.layout"])
        bitmaps = [n for n, info in layout.items() if info["layout"] == "bitmap"]
        assert bitmaps, layout  # the run's model is stored sparse
        for name in bitmaps:
            numel = state[name].numel()
            bits = np.unpackbits(f.get_tensor(f"{name}::bitmap").numpy(), count=numel)
            assert torch.equal(state[name].reshape(-1) != 0, torch.from_numpy(bits.astype(bool)))
            assert int(bits.sum()) == f.get_tensor(f"{name}::values").numel()
            assert 0 < bits.mean() < 1


def test_every_kind_of_source_gives_the_same_model(in_project: Path) -> None:
    run_dir = in_project / "runs" / "feddst-s0"
    ref = fedcomm.load_model(run_dir)
    for source in (str(run_dir), run_dir / "train", run_dir / "train" / "model.safetensors"):
        _same_tensors(fedcomm.load_model(source), ref)


def test_the_final_structures(in_project: Path) -> None:
    """ProgFed: the plain architecture (no temporary heads); FedAvg-MoG: its members."""
    progfed = fedcomm.load_model(in_project / "runs" / "progfed-s0")
    assert type(progfed).__name__ == "MLP" and not any("heads" in k for k in progfed.state_dict())
    mog = fedcomm.load_model(in_project / "runs" / "mog-s0")
    assert isinstance(mog, Ensemble) and len(mog.members) >= 2


def test_from_its_mlflow_run(
    in_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """By run id and runs:/ URI from the project's store (downloaded artifacts), and by
    ``tracking_uri=`` from anywhere: the run folder's model, and the accuracy MLflow logged."""
    run_dir = in_project / "runs" / "fedsparse-s0"
    run_id = json.loads((run_dir / "train" / "run.json").read_text())["mlflow_run_id"]
    ref = fedcomm.load_model(run_dir)
    for source in (run_id, f"runs:/{run_id}", f"runs:/{run_id}/model.safetensors"):
        _same_tensors(fedcomm.load_model(source), ref)
    uri = f"sqlite:///{in_project / 'mlflow.db'}"
    history = MlflowClient(uri).get_metric_history(run_id, "global/accuracy")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FEDCOMM_PROJECT_ROOT")
    model = fedcomm.load_model(run_id, tracking_uri=uri)
    _same_tensors(model, ref)
    monkeypatch.chdir(in_project)
    assert _test_accuracy(model, "fedsparse") == pytest.approx(history[-1].value, abs=1e-12)


def test_a_lone_model_file_needs_its_params(in_project: Path, tmp_path: Path) -> None:
    train = in_project / "runs" / "feddst-s0" / "train"
    lone = tmp_path / "model.safetensors"
    shutil.copyfile(train / "model.safetensors", lone)
    with pytest.raises(ModelLoadError, match=r"no run\.json beside the model.*pass params=") as e:
        fedcomm.load_model(lone)
    assert "\n" not in str(e.value) and isinstance(e.value, InputError)
    ref = fedcomm.load_model(train)
    config = json.loads((train / "run.json").read_text())["config"]
    _same_tensors(fedcomm.load_model(lone, params=train / "run.json"), ref)
    _same_tensors(fedcomm.load_model(lone, params=config), ref)
    # the project's params: the run and seed from a runs/<run>-s<seed> folder
    named = tmp_path / "feddst-s0" / "model.safetensors"
    named.parent.mkdir()
    shutil.copyfile(lone, named)
    raw = _params(None)
    _same_tensors(fedcomm.load_model(named, params=raw), ref)
    _same_tensors(fedcomm.load_model(named, params=Params.model_validate(raw)), ref)
    with pytest.raises(ModelLoadError, match="which run and seed"):
        fedcomm.load_model(lone, params=raw)  # four runs, no folder name


def test_without_the_dataset(
    in_project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dataset gives the input shape and classes: unreadable, the error says how to pass
    them; passed, it is not read."""
    train = in_project / "runs" / "cnn-s0" / "train"
    config = json.loads((train / "run.json").read_text())["config"]
    config["data"] = {"dataset": {"name": "mnist"}}  # files this test does not provide
    monkeypatch.delenv("FEDCOMM_DATA_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)  # no project params.yaml naming a data root
    monkeypatch.delenv("FEDCOMM_PROJECT_ROOT")
    with pytest.raises(ModelLoadError, match=r"dataset 'mnist'.*data_root=.*input_shape=") as e:
        fedcomm.load_model(train / "model.safetensors", params=config)
    assert "\n" not in str(e.value)
    model = fedcomm.load_model(
        train / "model.safetensors", params=config, input_shape=(1, 8, 8), num_classes=10
    )
    _same_tensors(model, fedcomm.load_model(train))
    with pytest.raises(ModelLoadError, match=r"tensor 'fc2\.weight' has shape \(10, 16\)"):
        fedcomm.load_model(train, input_shape=(1, 8, 8), num_classes=7)


def test_a_source_that_is_nothing(in_project: Path) -> None:
    with pytest.raises(ModelLoadError, match="no such run folder or model file"):
        fedcomm.load_model(in_project / "runs" / "nope-s0")
    with pytest.raises(ModelLoadError, match=r"holds no train/model\.safetensors"):
        fedcomm.load_model(in_project / "data")
    with pytest.raises(InputError, match="has no MLflow run 0123"):
        fedcomm.load_model("0123456789abcdef0123456789abcdef")


def test_importing_fedcomm_stays_cheap() -> None:
    """``import fedcomm`` imports neither torch nor MLflow; ``fedcomm.load_model`` does, then."""
    code = (
        "import sys, fedcomm\n"
        "assert not {'torch', 'mlflow', 'numpy'} & set(sys.modules), sorted(sys.modules)\n"
        "assert fedcomm.load_model.__module__ == 'fedcomm.tracking.saved_model'\n"
        "assert 'torch' in sys.modules\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)


def test_a_tensor_that_does_not_fit_is_named() -> None:
    """One check (``run_files.misfit``) for the evaluate stage's and load_model's messages."""
    from fedcomm.run_files import misfit

    state = {"w": torch.zeros(2, 3), "b": torch.zeros(2)}
    assert misfit({"w": torch.ones(2, 3)}, state) is None  # fewer tensors than the model: fine
    assert misfit({"v": torch.ones(1)}, state) == (
        "has tensor 'v', which the configured model lacks"
    )
    assert misfit({"w": torch.ones(3, 2)}, state, "the run's model", shape=" (check)") == (
        "tensor 'w' has shape (3, 2), the run's model (2, 3) (check)"
    )
