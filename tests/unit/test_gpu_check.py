"""The GPU check (``make gpu-check``, ``benchmarks/gpu_check.{sh,py}``) cannot rot: its CPU dry
run goes through the launcher and every part, every profile run and every runner the GPU run
takes; its budget, its error recording and its incremental JSON are checked on their own."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from fedcomm.algorithms import build_algorithm
from fedcomm.algorithms.fedavg import Config as FedAvgConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.config import load_params
from tests.conftest import digits_federation, small_loop

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gpu_check() -> Iterator[ModuleType]:
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        yield importlib.import_module("gpu_check")
    finally:
        sys.path.remove(str(REPO / "benchmarks"))


def read(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "gpu_check.json").read_text())
    return data


@pytest.mark.slow
def test_the_cpu_dry_run_runs_every_part_and_run(tmp_path: Path) -> None:
    """``bash benchmarks/gpu_check.sh --dry-run``: every part ok, every workload, runner,
    profile run and pfl runner trained one round and measured it (about a minute)."""
    env = {**os.environ, "GPU_CHECK_PYTHON": sys.executable}
    env.pop("OUT", None)
    cmd = ["bash", "benchmarks/gpu_check.sh", "--dry-run", "--budget-s", "5000"]
    proc = subprocess.run(
        [*cmd, "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    check_dry_run(read(tmp_path), (tmp_path / "gpu_check.log").read_text())


VARIANTS = {"fedbiad_ptb": ["fedbiad_counter_noise"]}  # FedBIAD's noise drawn on the device


def check_dry_run(report: dict[str, Any], log: str) -> None:
    assert report["finished"] is True
    parts = report["parts"]
    assert sorted(parts) == sorted(["env", "contract", "backends", "profiles", "pfl", "shard"])
    assert {p: parts[p]["status"] for p in parts} == dict.fromkeys(parts, "ok")
    assert parts["env"]["result"]["device"] == "cpu"

    contract = parts["contract"]["result"]
    assert contract["failed"] == contract["errors"] == 0
    assert contract["passed"] >= 3  # the CUDA-named tests that hold on a CPU
    assert contract["skipped"] >= 2 * 17  # every algorithm x backend: skipped without CUDA

    workloads = parts["backends"]["result"]["workloads"]
    assert sorted(workloads) == ["W1", "W2", "W3"]
    for wl in workloads.values():
        assert sorted(wl["runs"]) == ["cpu/plain", "cpu/sequential", "cpu/vectorized"]
        for run in wl["runs"].values():
            assert run["status"] == "ok" and len(run["round_s"]) == 1
            assert run["s_per_round"] > 0 and 0 <= run["final_accuracy"] <= 1
            assert run["x_flop_bound"] > 0  # measured against this machine's matmul throughput
        assert wl["cpu/sequential_over_vectorized"] > 0

    profiles = parts["profiles"]["result"]
    assert sorted(profiles) == sorted(gpu_check_profiles())
    for name, node in profiles.items():
        runs = load_params(REPO / "pipeline" / "reproductions" / f"{name}.yaml").experiment.runs
        runs = [*runs, *VARIANTS.get(name, [])]  # the runs the check adds
        assert sorted(node["runs"]) == sorted(runs), name
        assert node["data"].startswith("synthetic")
        for run_name, run in node["runs"].items():
            where = f"{name}/{run_name}"
            assert run["status"] == "ok", where
            assert run["rounds_done"] == 1 and run["stopped"] is None, where
            assert run["eval_rounds"] == [1], where  # the last round is always evaluated
            assert 0 <= run["global_accuracy"] <= 1, where
            assert run["up_bytes_per_round"] > 0 and run["down_bytes_per_round"] > 0, where
            assert run["parameters"] > 0 and run["s_per_round"] > 0, where
            assert run["projected_full_run_s"] > run["s_per_round"], where  # (> 1 round)
    assert profiles["fedbiad_ptb"]["runs"]["fedbiad"]["topk_accuracy"] is not None
    # the profiles say backend: auto: sequential for conv nets on a CPU (vectorized on a GPU)
    assert profiles["fedsparse_cifar10"]["runs"]["fedsparse_mid"]["backend_ran"] == "sequential"
    assert profiles["feddst_cifar10"]["runs"]["prunefl"]["backend_ran"] == "sequential"

    shard = parts["shard"]["result"]["workloads"]["W1"]  # one simulation on 1 and 2 processes
    assert shard["2"]["final_model"] == "bit-identical" and shard["2"]["speedup"] > 0

    pfl = parts["pfl"]["result"]
    assert sorted(pfl["runs"]) == ["plain", "sequential", "vectorized", "vectorized-no-dropout"]
    assert all(run["status"] == "ok" for run in pfl["runs"].values())
    assert pfl["vectorized_fallback"] is None  # dropout masks given per client: batched
    assert pfl["parameters"] == 1_626_442
    assert "done: every part ok" in log


def gpu_check_profiles() -> list[str]:
    return ["fedsparse_cifar10", "feddst_cifar10", "fedbiad_ptb", "progfed_cifar100"]


def test_parts_without_time_are_skipped_and_recorded(gpu_check: ModuleType, tmp_path: Path) -> None:
    rc = gpu_check.main(["--device", "cpu", "--budget-s", "0", "--out", str(tmp_path)])
    assert rc == 0
    parts = read(tmp_path)["parts"]
    assert parts["env"]["status"] == "ok"  # always: it takes no share of the budget
    for name in ("contract", "backends", "profiles", "pfl"):
        assert parts[name]["status"] == "skipped", name
        assert "budget spent" in parts[name]["reason"]


def test_a_failing_part_is_recorded_and_the_next_runs(
    gpu_check: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The error is in the JSON on disk before the next part starts; the exit status is 1."""
    seen: dict[str, Any] = {}

    def broken(*_: Any) -> None:
        raise RuntimeError("no GPU left")

    def after(*args: Any) -> None:
        seen.update(read(tmp_path)["parts"]["contract"])  # as a killed run would leave it
        args[-1].data["runs"] = {"a": {"status": "ok"}, "b": {"status": "error", "error": "x"}}

    monkeypatch.setitem(gpu_check.PART_FNS, "contract", broken)
    monkeypatch.setitem(gpu_check.PART_FNS, "pfl", after)
    argv = ["--device", "cpu", "--parts", "contract", "pfl", "--out", str(tmp_path)]
    assert gpu_check.main(argv) == 1
    assert seen["status"] == "error" and seen["error"] == "RuntimeError: no GPU left"
    parts = read(tmp_path)["parts"]
    assert parts["contract"]["status"] == "error"
    # a part whose own runs failed is an error too, with its numbers kept
    assert parts["pfl"]["status"] == "error" and parts["pfl"]["result"]["runs"]["a"]
    assert read(tmp_path)["finished"] is True


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_missing_gpu_is_one_line_and_exit_2(
    gpu_check: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gpu_check.main(["--device", "cuda", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "'cuda' is not available" in err and "--dry-run" in err
    assert not (tmp_path / "gpu_check.json").exists()


def test_a_run_stops_at_its_deadline_with_the_rounds_it_did(gpu_check: ModuleType) -> None:
    fed = digits_federation(6)
    model, cfg = small_loop(fed, rounds=3)
    algorithm = build_algorithm(FedAvgConfig())
    cpu = torch.device("cpu")
    res = gpu_check.timed_run(
        cfg, algorithm, model, fed, build_compressor("none"), cpu, time.perf_counter()
    )
    assert res["rounds_done"] == 1 and len(res["round_s"]) == 1
    assert "stopped after round 1 of 3" in res["stopped"]
    model, cfg = small_loop(fed, rounds=2)
    whole = gpu_check.timed_run(
        cfg, algorithm, model, fed, build_compressor("none"), cpu, time.perf_counter() + 600
    )
    assert whole["rounds_done"] == 2 and whole["stopped"] is None
    assert whole["backend_ran"] == "sequential" and whole["eval_rounds"] == [1, 2]


def test_the_carried_digits_are_scikit_learns(gpu_check: ModuleType) -> None:
    """The contract tests read the same digits without scikit-learn (on the GPU machine)."""
    from importlib.resources import files

    from sklearn.datasets import load_digits

    path = Path(str(files("sklearn.datasets") / "data" / "digits.csv.gz"))
    ours, theirs = gpu_check.read_digits(path), load_digits()
    assert ours.images.shape == (1797, 8, 8)
    assert (ours.images == theirs.images).all() and (ours.target == theirs.target).all()


def test_the_pfl_cnn_is_pfl_researchs(gpu_check: ModuleType) -> None:
    """pfl-research's simple_cnn on 3x32x32: its layer shapes, and no dropout when asked."""
    model = gpu_check.pfl_simple_cnn()
    shapes = [tuple(p.shape) for p in model.parameters()]
    assert shapes == [(32, 3, 3, 3), (32,), (64, 32, 3, 3), (64,), (128, 12544), (128,),
                      (10, 128), (10,)]  # fmt: skip
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
    plain = gpu_check.pfl_simple_cnn(dropout=False)
    assert not any(isinstance(m, torch.nn.Dropout) for m in plain.modules())


@pytest.mark.slow
def test_a_terminated_check_keeps_the_runs_it_finished(tmp_path: Path) -> None:
    """SIGTERM (the launcher's timeout) mid-part: every run that ended is in the JSON, the part
    says it was stopped, the exit status is 124."""
    cmd = [sys.executable, "benchmarks/gpu_check.py", "--dry-run", "--parts", "backends"]
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    proc = subprocess.Popen([*cmd, "--out", str(tmp_path)], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        runs: dict[str, Any] = {}
        while not runs and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
            try:
                part = read(tmp_path)["parts"].get("backends", {})
            except (FileNotFoundError, json.JSONDecodeError):
                continue
            runs = part.get("result", {}).get("workloads", {}).get("W1", {}).get("runs", {})
        assert runs, "no run was recorded"
        proc.terminate()
        assert proc.wait(timeout=120) == 124
    finally:
        proc.kill()
    report = read(tmp_path)
    part = report["parts"]["backends"]
    assert part["status"] == "error" and "stopped by signal 15" in part["error"]
    assert report["finished"] is False
    kept = part["result"]["workloads"]["W1"]["runs"]
    assert runs.keys() <= kept.keys() and all(kept[k]["status"] == "ok" for k in runs)


def test_a_gpu_run_measures_each_workload_on_the_gpu_and_the_cpu(
    gpu_check: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backends part's bookkeeping for a CUDA device (as ``resolve`` names it: cuda:0),
    with the runs themselves replaced: no GPU here."""
    calls: list[tuple[str, str]] = []

    def fake_run(wl: Any, data: Any, rounds: int, runner: str, dev: Any, seed: int) -> Any:
        calls.append((str(dev), runner))
        return {"status": "ok", "s_per_round": 2.0 if runner == "sequential" else 1.0}

    monkeypatch.setattr(gpu_check, "one_backend_run", fake_run)
    monkeypatch.setattr(gpu_check.backends, "matmul_gflops", lambda dev: 100.0)
    args = gpu_check.parse(["--device", "cpu", "--rounds", "1", "--small"])
    out: dict[str, Any] = {}
    gpu = torch.device("cuda", 0)
    res = gpu_check.Result(out, lambda: None)
    gpu_check.part_backends(args, gpu, time.perf_counter() + 600, res)
    assert sorted(out["matmul_gflops"]) == ["cpu", "cuda"]
    # 3 workloads x 2 devices x 3 runners, and W1 compiled (CUDA graphs) on the GPU
    assert {dev for dev, _ in calls} == {"cuda:0", "cpu"} and len(calls) == 3 * 2 * 3 + 1
    assert ("cuda:0", "vectorized-reduce-overhead") in calls
    for name, wl in out["workloads"].items():
        runners = ("plain", "sequential", "vectorized")
        expected = [f"{d}/{r}" for d in ("cpu", "cuda") for r in runners]
        compiled = ["cuda/vectorized-reduce-overhead"] if name == "W1" else []
        assert sorted(wl["runs"]) == sorted(expected + compiled)
        assert wl["cuda/sequential_over_vectorized"] == wl["cpu/sequential_over_vectorized"] == 2
        assert all(run["x_flop_bound"] > 0 for run in wl["runs"].values())
