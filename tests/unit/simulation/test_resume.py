"""A run killed mid-way (SIGKILL) and resumed ends with the numbers of an uninterrupted run,
in the same MLflow run, with every round logged exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml
from mlflow import MlflowClient

from fedcomm.simulation.loop import CRASH_ENV
from fedcomm.sparse_io import load_sparse
from tests.conftest import tiny_params

pytestmark = pytest.mark.slow


def _fedcomm(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "FEDCOMM_PROJECT_ROOT": str(cwd), **(env or {})}
    full.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(
        [sys.executable, "-m", "fedcomm.cli", *args],
        cwd=cwd,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _setup(root: Path) -> Path:
    root.mkdir()
    params = tiny_params(**{"train.rounds": 5, "train.checkpoint_every": 2})
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    assert _fedcomm(root, "partition").returncode == 0
    return root


def _numbers(path: Path) -> pl.DataFrame:
    frame = pl.read_parquet(path / "rounds.parquet")
    return frame.select([c for c in frame.columns if not c.startswith("time/")])


def _runs(root: Path) -> list[tuple[str, str, list[int]]]:
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tests")
    assert exp is not None
    return [
        (
            r.info.run_name or "",
            r.info.status,
            sorted(m.step for m in client.get_metric_history(r.info.run_id, "global/accuracy")),
        )
        for r in client.search_runs([exp.experiment_id])
    ]


def test_kill_before_the_first_checkpoint_keeps_one_mlflow_run(tmp_path: Path) -> None:
    root = _setup(tmp_path / "early")
    res = _fedcomm(root, "train", "--run", "fedavg", env={CRASH_ENV: "1"})
    assert res.returncode == -signal.SIGKILL
    assert _runs(root) == [("fedavg-s0", "RUNNING", [1])]  # killed: nobody could mark it
    assert _fedcomm(root, "train", "--run", "fedavg").returncode == 0
    assert _runs(root) == [("fedavg-s0", "FINISHED", [1, 2, 3, 4, 5])]


def test_killed_run_resumes_to_identical_numbers(tmp_path: Path) -> None:
    straight = _setup(tmp_path / "straight")
    assert _fedcomm(straight, "train", "--run", "fedprox").returncode == 0

    killed = _setup(tmp_path / "killed")
    res = _fedcomm(killed, "train", "--run", "fedprox", env={CRASH_ENV: "3"})
    assert res.returncode == -signal.SIGKILL, res.stderr
    ckpt = killed / ".fedcomm" / "checkpoints" / "fedprox-s0" / "state.pt"
    assert ckpt.is_file()  # saved after round 2; round 3 ran and was logged, then the kill
    assert not (killed / "runs").exists()  # no half-written outputs
    res = _fedcomm(killed, "train", "--run", "fedprox")
    assert res.returncode == 0, res.stderr
    assert not ckpt.exists()  # removed once the run completed

    a, b = straight / "runs" / "fedprox-s0" / "train", killed / "runs" / "fedprox-s0" / "train"
    assert _numbers(a).equals(_numbers(b))
    assert pl.read_parquet(a / "ledger.parquet").equals(pl.read_parquet(b / "ledger.parquet"))
    ma, mb = load_sparse(a / "model.safetensors"), load_sparse(b / "model.safetensors")
    assert all((ma[k] == mb[k]).all() for k in ma)

    # MLflow: one run, finished, every round logged exactly once with the uninterrupted values
    def history(root: Path) -> tuple[list[tuple[int, float]], str]:
        client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
        exp = client.get_experiment_by_name("tests")
        assert exp is not None
        runs = client.search_runs([exp.experiment_id])
        assert len(runs) == 1
        hist = client.get_metric_history(runs[0].info.run_id, "global/accuracy")
        return sorted((m.step, m.value) for m in hist), runs[0].info.status

    (ha, sa), (hb, sb) = history(straight), history(killed)
    assert [s for s, _ in hb] == [1, 2, 3, 4, 5]
    assert ha == hb
    assert sa == sb == "FINISHED"
