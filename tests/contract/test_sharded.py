"""One simulation over two processes (torch's elastic launcher, gloo on the CPU) against one.

A round's clients are split over the ranks and their turns gathered (:mod:`.shard`), so the run
must be the one-process run: on the sequential backend bit for bit (round metrics, ledger, final
model) for every registered algorithm, whose client state, payloads and generator travel
between the processes; on the vectorized backend within the contract tests' tolerance (its chunks
then hold other clients). The train stage's ``--nproc`` and a killed rank are tested with the
pipeline (``tests/pipeline/test_torchrun.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fedcomm.simulation.data import FederatedTensors
from tests.conftest import digits_federation
from tests.contract import _sharded_worker as worker
from tests.contract.test_backends import _run

WORKER = Path(worker.__file__)


@pytest.fixture(scope="module")
def sharded_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sharded")
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        str(WORKER), str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


@pytest.mark.parametrize(("name", "backend"), worker.CASES)
def test_two_processes_equal_one(
    name: str, backend: str, sharded_results: Path, fed: FederatedTensors
) -> None:
    two = torch.load(sharded_results / f"{name}-{backend}.pt", weights_only=False)
    torch.set_num_threads(1)  # (the ranks' intra-op threads: sums in the same order)
    if (name, backend) == worker.SYSTEM_CASE:
        one = worker.result(worker.system_run())
        statuses = {c["status"] for c in one["clients"]}
        assert "partial_work" in statuses  # the case: a straggler retrained under the deadline
    elif (name, backend) == worker.FIT_CASE:
        one = worker.result(worker.fit_run())
        assert len({c["uplink_setting"] for c in one["clients"]}) > 1  # retrained at other p
        other = torch.load(sharded_results / f"{name}-{backend}-rank1.pt", weights_only=False)
        evaluated = {"local_accuracy", "local_loss", "test_n"}  # (rank 0 alone evaluates)
        rows = [[{k: v for k, v in c.items() if k not in evaluated} for c in r["clients"]]
                for r in (other, two)]  # fmt: skip
        assert rows[0] == rows[1]  # rank 1 timed and decided as rank 0 did
    else:
        one = worker.result(_run(name, fed, backend))
    assert two["backend"] == one["backend"]
    assert two["ledger"] == one["ledger"]  # bits: exact on both backends
    if backend != "vectorized":
        assert two["clients"] == one["clients"]  # client rows (wall seconds left out)
        assert two["rounds"] == one["rounds"]
        assert all(torch.equal(two["final"][k], one["final"][k]) for k in one["final"])
        return
    for a, b in zip(one["rounds"], two["rounds"], strict=True):
        assert a.keys() == b.keys()
        for k, v in a.items():
            assert b[k] == pytest.approx(v, rel=1e-4, abs=1e-5, nan_ok=True), (a["round"], k)
    for k, v in one["final"].items():
        torch.testing.assert_close(two["final"][k], v, rtol=1e-4, atol=1e-5)


def test_the_gathers_carry_every_remote_client(sharded_results: Path) -> None:
    traffic = torch.load(sharded_results / "traffic.pt", weights_only=False)
    # two a round (results, local models), and two more for each straggler retrained
    assert traffic["gathers"] > 2 * 3 * len(worker.CASES)
    assert traffic["bytes_in"] > 0 and traffic["bytes_out"] > 0
