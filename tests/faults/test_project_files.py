"""Fault injection on the files a user or an earlier stage leaves in the project, besides the
partition, the checkpoint, the datasets and the MLflow store (their own modules):

- ``params.yaml`` (every command reads it; tried with ``train``);
- a search space (``fedcomm sweep``);
- a trained run's ``train/`` files (``evaluate`` reads all five);
- a run's ``summary.json`` and ``train/rounds.parquet`` (``summarize`` reads them).

Each is tried missing, empty, truncated, corrupted and from another version. Every case ends in
exit status 2 and an ``error:`` line that names the file and the remedy, with no traceback, and
leaves the project exactly as it was (no file written, changed or removed) with no MLflow run
``RUNNING``. A params or search-space file with bad keys lists one indented line per problem
under the ``error:`` line (each names the key and what is allowed): that is its remedy.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.sparse_io import save_sparse
from tests.conftest import tiny_params
from tests.faults._project import enter_copy
from tests.faults.test_partition_files import _running_mlflow_runs

pytestmark = pytest.mark.slow

RUN = Path("runs") / "fedavg-s0"
TRAIN_REMEDY = "fedcomm train --run fedavg --seed 0"
EVAL_REMEDY = "fedcomm evaluate --run fedavg --seed 0"
SPACE = """base: params.yaml
run: fedavg
trials: 1
seeds: [0]
objective: {kind: single, metric: global/accuracy, reduce: final}
space:
  train.local.lr: {type: float, low: 0.01, high: 0.2, log: true}
"""


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(4, len(data) - 8, 3):  # keep magic bytes at both ends, garble the rest
        data[i] ^= 0xA5
    path.write_bytes(bytes(data))


FAULTS: dict[str, Callable[[Path], None]] = {
    "missing": lambda p: p.unlink(),
    "empty": lambda p: p.write_bytes(b""),
    "truncated": _truncate,
    "corrupted": _corrupt,
}


# --- "from another version": what an older or newer layout of each file looks like ----------


def _old_params(path: Path) -> None:  # keys renamed: train.local.lr was once train.lr
    raw = yaml.safe_load(path.read_text())
    raw["train"]["lr"] = raw["train"]["local"].pop("lr")
    raw["experiment"]["algorithms"] = raw["experiment"].pop("runs")
    path.write_text(yaml.safe_dump(raw))


def _old_space(path: Path) -> None:  # `params:` instead of `space:`, `metric` at the top level
    raw = yaml.safe_load(path.read_text())
    raw["params"] = raw.pop("space")
    raw["metric"] = raw.pop("objective")["metric"]
    path.write_text(yaml.safe_dump(raw))


def _renamed_column(path: Path) -> None:
    frame = pl.read_parquet(path)
    frame.rename({frame.columns[0]: f"{frame.columns[0]}_v0"}).write_parquet(path)


def _other_model(path: Path) -> None:  # a model of another width (hidden 16 -> 8)
    import torch

    shapes = {"fc1.weight": (8, 64), "fc1.bias": (8,), "fc2.weight": (10, 8), "fc2.bias": (10,)}
    save_sparse({k: torch.zeros(v) for k, v in shapes.items()}, path)


def _other_config(path: Path) -> None:  # trained with another learning rate
    doc = json.loads(path.read_text())
    doc["config"]["train"]["local"]["lr"] = 0.5
    path.write_text(json.dumps(doc))


def _old_json(path: Path) -> None:  # the keys this version reads are gone
    path.write_text(json.dumps({"version": 0, "accuracy": 0.5}))


WRONG_VERSION: dict[str, Callable[[Path], None]] = {
    "params.yaml": _old_params,
    "space.yaml": _old_space,
    "rounds.parquet": _renamed_column,
    "ledger.parquet": _renamed_column,
    "clients.parquet": _renamed_column,
    "model.safetensors": _other_model,
    "run.json": _other_config,
    "summary.json": _old_json,
}


def _damage(path: Path, fault: str) -> None:
    (WRONG_VERSION[path.name] if fault == "wrong_version" else FAULTS[fault])(path)


# --- the project, and what a clean failure is -------------------------------------------------


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny project with fedavg seed 0 trained and evaluated (each case works on a copy)."""
    root = tmp_path_factory.mktemp("project_faults")
    params = tiny_params(**{"train.rounds": 2, "experiment.runs": ["fedavg"]})
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    (root / "space.yaml").write_text(SPACE)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("FEDCOMM_PROJECT_ROOT", str(root))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        for args in (["partition"], ["train", "--run", "fedavg"], ["evaluate", "--run", "fedavg"]):
            res = CliRunner().invoke(app, args)
            assert res.exit_code == 0, res.output
    return root


@pytest.fixture
def project(evaluated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return enter_copy(evaluated, tmp_path / "project", monkeypatch)


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in root.rglob("*")
        if p.is_file()
    }


def _fails_cleanly(root: Path, args: list[str], damaged: Path, remedy: str) -> list[str]:
    """Run ``args``; check the failure contract; return the output's lines."""
    before = _tree(root)
    res = CliRunner().invoke(app, args)
    lines = res.output.strip().splitlines()
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output and lines[0].startswith("error: "), res.output
    assert damaged.name in lines[0], res.output  # the file ...
    if len(lines) == 1:
        assert remedy in lines[0], res.output  # ... and the remedy
    else:  # a schema error: one line per problem, each naming a key
        assert all(line.startswith("  - ") and ":" in line for line in lines[1:]), res.output
    assert _tree(root) == before, "the failed command changed the project"
    assert _running_mlflow_runs(root) == 0
    return lines


CASES = [*FAULTS, "wrong_version"]


@pytest.mark.parametrize("fault", CASES)
def test_damaged_params(project: Path, fault: str) -> None:
    shutil.rmtree(project / "runs")  # nothing trained: train must not start one
    path = project / "params.yaml"
    _damage(path, fault)
    remedy = "--params" if fault != "wrong_version" else ""
    lines = _fails_cleanly(project, ["train", "--run", "fedavg"], path, remedy)
    if fault == "wrong_version":
        assert any("train.lr" in line and "allowed keys" in line for line in lines), lines


@pytest.mark.parametrize("fault", CASES)
def test_damaged_search_space(project: Path, fault: str) -> None:
    path = project / "space.yaml"
    _damage(path, fault)
    lines = _fails_cleanly(project, ["sweep", "space.yaml"], path, "pipeline/search_spaces")
    if fault == "wrong_version":
        assert any("space" in line for line in lines[1:]), lines


TRAIN_FILES = [
    "rounds.parquet",
    "ledger.parquet",
    "clients.parquet",
    "model.safetensors",
    "run.json",
]


@pytest.mark.parametrize("fault", CASES)
@pytest.mark.parametrize("name", TRAIN_FILES)
def test_damaged_train_output_stops_evaluate(project: Path, name: str, fault: str) -> None:
    for stale in ("summary.json", "metrics.json", "eval_clients.parquet"):
        (project / RUN / stale).unlink()
    shutil.rmtree(project / RUN / "plots")
    path = project / RUN / "train" / name
    _damage(path, fault)
    _fails_cleanly(project, ["evaluate", "--run", "fedavg"], path, TRAIN_REMEDY)
    for output in ("summary.json", "metrics.json"):
        assert not (project / RUN / output).exists()  # nothing half-written


@pytest.mark.parametrize("fault", CASES)
@pytest.mark.parametrize("name", ["summary.json", "train/rounds.parquet"])
def test_damaged_run_output_stops_summarize(project: Path, name: str, fault: str) -> None:
    path = project / RUN / name
    _damage(path, fault)
    remedy = EVAL_REMEDY if name == "summary.json" else TRAIN_REMEDY
    _fails_cleanly(project, ["summarize"], path, remedy)
    assert not (project / "reports").exists()


def test_a_train_folder_that_is_gone_names_the_command(project: Path) -> None:
    shutil.rmtree(project / RUN / "train")
    res = CliRunner().invoke(app, ["evaluate", "--run", "fedavg"])
    assert res.exit_code == 2 and res.output.startswith("error: "), res.output
    assert "train" in res.output and TRAIN_REMEDY in res.output, res.output
