"""``fedcomm train --nproc 2`` (``train.nproc``): the default experiment's run (cut to 12 rounds,
a checkpoint every 3) trained by two processes equals the one-process run, and a killed process
stops the run, which resumes from its last checkpoint with any number of processes.
Subprocesses, as a user runs them; one thread a process on both sides, so the sums run in the
same order (docs/speed.md)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml
from safetensors.torch import load_file

from fedcomm.simulation.loop import CRASH_ENV, CRASH_RANK_ENV
from tests.unit.simulation.test_resume import _fedcomm, _numbers, _runs

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ONE = {"OMP_NUM_THREADS": "1"}


def _default_project(root: Path, **train: object) -> Path:
    """The repository's params.yaml (the default experiment, 12 rounds, a checkpoint every 3),
    MLflow under ``tests``."""
    root.mkdir()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["train"].update({"rounds": 12, "checkpoint_every": 3, **train})
    params.setdefault("tracking", {})["experiment"] = "tests"
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    assert _fedcomm(root, "partition").returncode == 0
    return root


def _outputs(
    root: Path,
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, dict[str, torch.Tensor]]:
    train = root / "runs" / "fedavg-s0" / "train"
    clients = pl.read_parquet(train / "clients.parquet").drop("train_s")
    return (
        _numbers(train),
        pl.read_parquet(train / "ledger.parquet"),
        clients,
        load_file(train / "model.safetensors"),
    )


def _assert_same(a: Path, b: Path) -> None:
    (ra, la, ca, ma), (rb, lb, cb, mb) = _outputs(a), _outputs(b)
    assert ra.equals(rb) and la.equals(lb) and ca.equals(cb)
    assert ma.keys() == mb.keys() and all(torch.equal(ma[k], mb[k]) for k in ma)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = _default_project(tmp_path_factory.mktemp("one") / "p")
    res = _fedcomm(root, "train", "--run", "fedavg", env=ONE)
    assert res.returncode == 0, res.stderr
    return root


def test_a_killed_process_stops_the_run_which_resumes_with_any_number(
    one_process: Path, tmp_path: Path
) -> None:
    root = _default_project(tmp_path / "killed")
    kill_rank_1 = {**ONE, CRASH_ENV: "4", CRASH_RANK_ENV: "1"}
    res = _fedcomm(root, "train", "--run", "fedavg", "--nproc", "2", env=kill_rank_1)
    assert res.returncode == 128 + signal.SIGKILL, res.stderr
    assert "error: process 1 of 2 stopped (killed by signal 9), and with it the run" in res.stderr
    ckpt = root / ".fedcomm" / "checkpoints" / "fedavg-s0" / "state.pt"
    assert torch.load(ckpt, weights_only=False)["state"].round_ == 3  # rank 0's last (every 3)
    assert not (root / "runs").exists()  # nothing half-written
    # one process now, killed again after round 8; then two processes to the end, asked for by
    # the params key (the DVC stage's way; not part of the run's identity: the checkpoint holds)
    res = _fedcomm(root, "train", "--run", "fedavg", env={**ONE, CRASH_ENV: "8"})
    assert res.returncode == -signal.SIGKILL
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["train"]["nproc"] = 2
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    res = _fedcomm(root, "train", "--run", "fedavg", env=ONE)
    assert res.returncode == 0, res.stderr
    assert "resuming fedavg-s0 from the checkpoint of round 6" in res.stdout + res.stderr
    assert res.stdout.count("wrote runs/fedavg-s0/train") == 1  # rank 0 writes, says so once
    _assert_same(one_process, root)  # metrics, ledger, client rows, final model: bit for bit
    assert _runs(root) == [("fedavg-s0", "FINISHED", list(range(1, 13)))]
    shutil.rmtree(root / ".fedcomm", ignore_errors=True)


def test_nproc_that_disagrees_with_torchrun_is_refused(tmp_path: Path) -> None:
    root = _default_project(tmp_path / "p")
    env = {"WORLD_SIZE": "2", "RANK": "0"}
    res = _fedcomm(root, "train", "--run", "fedavg", "--nproc", "3", env=env)
    assert res.returncode == 2
    assert "error: --nproc 3, but torchrun started 2 processes" in res.stderr
