"""Backend benchmark: the library's backends against a plain PyTorch loop and a FLOP bound.

Workloads (MNIST train images from the data root, IID; the 10,000 test images evaluated every
round; 1 local epoch of plain SGD, server SGD lr 1):

- W1: MLP 784-128-10, 1000 clients x 60 samples, 100 clients per round, batch 10, lr 0.05;
- W2: the LeNet-like `cnn` (conv 5x5x32, conv 5x5x64, fc 512, 582,026 parameters),
  100 clients x 600 samples, 10 clients per round, batch 32, lr 0.05;
- W3, paper size (FedSparse's CIFAR-10 LeNet-5, ``pipeline/reproductions/fedsparse_cifar10.yaml``):
  the same ``cnn`` on 3x32x32 inputs (878,538 parameters), CIFAR-10's 50,000 training images
  IID over 100 clients, 10 per round, batch 64, lr 0.05, its 10,000 test images. Read from the
  data root when CIFAR-10 is there, else random tensors of the same shapes (seeded; the speed is
  the same, the accuracy is chance): the result's ``data`` says which.

Runners (every repeat of a (workload, runner) is a process of its own, with its own peak RSS):

- ``vectorized`` / ``sequential``: ``fedcomm.simulation.loop.run`` with FedAvg on that backend;
- ``plain``: what research code does: ``copy.deepcopy`` of the global model per client, a
  ``DataLoader`` per client, a ``torch.optim.SGD`` per client, ``state_dict`` averaging, and a
  ``DataLoader`` evaluation under ``no_grad``; same cohorts as the library;
- ``vectorized-fedsparse`` / ``-fedbiad`` / ``-feddst``: those algorithms (default configs) on
  the vectorized backend, against FedAvg's vectorized round;
- ``*-no-malloc-tuning``: the same with ``FEDCOMM_MALLOC_TUNING=0`` (glibc's default mmap and
  trim thresholds: see ``fedcomm.simulation.allocator``).

The FLOP lower bound of a round is (3 x forward FLOPs x training samples + forward FLOPs x test
samples) / the best matmul throughput measured in the same run (forward + backward ~ 3 x forward;
forward FLOPs counted by ``torch.utils.flop_counter`` on the real model).

    python benchmarks/backends.py [--workloads W1 W2] [--runners vectorized sequential plain ...]
                                  [--rounds N] [--repeats 3] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.flop_counter import FlopCounterMode

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.algorithms._local import LocalConfig
from fedcomm.algorithms.base import ClientData
from fedcomm.comm.codecs import build_compressor
from fedcomm.data.datasets import DATA_ROOT_ENV, DatasetNotFoundError, load_dataset
from fedcomm.data.federated import PartitionSpec, make_partition
from fedcomm.data.types import Dataset
from fedcomm.models import build_model
from fedcomm.seeding import Stream, torch_generator
from fedcomm.simulation import allocator, loop
from fedcomm.simulation.data import FederatedTensors

REPO = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Workload:
    model: str
    model_kw: dict[str, Any]
    clients: int
    per_round: int
    batch: int
    lr: float
    rounds: int  # default rounds per repeat
    dataset: str = "mnist"  # "mnist" (W1, W2) | "cifar10" (W3; synthetic if absent)
    shape: tuple[int, ...] = (1, 28, 28)
    n_train: int = 60_000


WORKLOADS = {
    "W1": Workload("mlp", {"hidden": [128]}, 1000, per_round=100, batch=10, lr=0.05, rounds=20),
    "W2": Workload("cnn", {}, 100, per_round=10, batch=32, lr=0.05, rounds=5),
    "W3": Workload(
        "cnn",
        {},
        100,
        per_round=10,
        batch=64,
        lr=0.05,
        rounds=3,
        dataset="cifar10",
        shape=(3, 32, 32),
        n_train=50_000,
    ),
}


@dataclasses.dataclass(frozen=True)
class Runner:
    kind: str  # "library" | "plain"
    backend: str = "sequential"
    algorithm: str = "fedavg"
    env: tuple[tuple[str, str], ...] = ()


NO_TUNING = (("FEDCOMM_MALLOC_TUNING", "0"),)
RUNNERS = {
    "vectorized": Runner("library", "vectorized"),
    "sequential": Runner("library", "sequential"),
    "plain": Runner("plain"),
    "plain-no-malloc-tuning": Runner("plain", env=NO_TUNING),
    "vectorized-fedsparse": Runner("library", "vectorized", "fedsparse"),
    "vectorized-fedbiad": Runner("library", "vectorized", "fedbiad"),
    "vectorized-feddst": Runner("library", "vectorized", "feddst"),
    "vectorized-no-malloc-tuning": Runner("library", "vectorized", env=NO_TUNING),
    "sequential-no-malloc-tuning": Runner("library", "sequential", env=NO_TUNING),
}
DEFAULT_RUNNERS = {
    "W1": list(RUNNERS),
    "W2": ["vectorized", "sequential", "plain"],
    "W3": ["vectorized", "sequential", "plain"],
}


def _pool(wl: Workload, data_root: str, seed: int) -> tuple[Dataset, str]:
    """The workload's dataset (official train rows first, then test) and where it came from."""
    if wl.dataset == "mnist":
        return load_dataset("mnist", data_root), "mnist"
    try:
        return load_dataset(wl.dataset, data_root), wl.dataset
    except DatasetNotFoundError:  # same shapes, random values: the speed does not change
        g = np.random.default_rng(seed)
        n = wl.n_train + 10_000
        x = g.standard_normal((n, *wl.shape), dtype=np.float32)
        y = g.integers(0, 10, n)
        return Dataset(wl.dataset, x, y, 10), "synthetic"


def start_up(
    wl: Workload, data_root: str, seed: int
) -> tuple[FederatedTensors, torch.nn.Module, str]:
    """The train rows IID over the workload's clients; the 10k test rows as global test."""
    pool, source = _pool(wl, data_root, seed)
    train = Dataset(wl.dataset, pool.x[: wl.n_train], pool.y[: wl.n_train], pool.num_classes)
    part = make_partition(train, PartitionSpec("iid", wl.clients, {}, 0.0, seed))
    data = FederatedTensors.build(train, part.train, part.test)
    test = ClientData(  # copies: a view would keep every float image alive
        torch.from_numpy(pool.x[wl.n_train :].copy()),
        torch.from_numpy(np.asarray(pool.y[wl.n_train :])).long(),
    )
    del pool, train
    data = dataclasses.replace(data, global_test=test)
    gen = torch_generator(seed, Stream.INIT)  # as experiment.build_run_model seeds it
    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    model = build_model(wl.model, input_shape=wl.shape, num_classes=10, **wl.model_kw)
    return data, model, source


def run_library(
    wl: Workload,
    data: FederatedTensors,
    model: torch.nn.Module,
    rounds: int,
    seed: int,
    backend: str = "sequential",
    algorithm_name: str = "fedavg",
) -> tuple[list[float], float]:
    local = LocalConfig(epochs=1, batch_size=wl.batch, lr=wl.lr)
    cfg = loop.LoopConfig(rounds, wl.per_round, local, seed, eval_every=1, backend=backend)
    config = CONFIGS[algorithm_name]().with_rounds(rounds)  # the algorithm's defaults
    algorithm, compressor = build_algorithm(config), build_compressor("none")
    stamps: list[float] = []
    t0 = time.perf_counter()
    result = loop.run(
        cfg,
        algorithm,
        model,
        data,
        compressor,
        config_hash="bench",
        progress=lambda r, m: stamps.append(time.perf_counter()),
    )
    round_s = [b - a for a, b in zip([t0, *stamps[:-1]], stamps, strict=True)]
    return round_s, float(result.state.round_rows[-1]["global/accuracy"])


def run_plain(
    wl: Workload, data: FederatedTensors, model: torch.nn.Module, rounds: int, seed: int
) -> tuple[list[float], float]:
    """A typical research-code FedAvg loop (same cohorts as the library)."""
    gen = torch.Generator().manual_seed(seed)
    round_s: list[float] = []
    acc = 0.0
    for r in range(1, rounds + 1):
        t0 = time.perf_counter()
        cohort = loop.sample_cohort(seed, r, data.num_clients, wl.per_round)
        states, weights = [], []
        for cid in cohort:
            local = copy.deepcopy(model)
            local.train()
            opt = torch.optim.SGD(local.parameters(), lr=wl.lr)
            d = data.train[cid]
            loader = DataLoader(
                TensorDataset(d.x, d.y), batch_size=wl.batch, shuffle=True, generator=gen
            )
            for xb, yb in loader:
                opt.zero_grad()
                F.cross_entropy(local(xb), yb).backward()
                opt.step()
            states.append(local.state_dict())
            weights.append(d.num_examples)
        total = sum(weights)
        avg = {
            k: sum(w * s[k] for w, s in zip(weights, states, strict=True)) / total
            for k in states[0]
        }
        model.load_state_dict(avg)
        model.eval()
        correct = 0
        test = data.global_test
        with torch.no_grad():
            for xb, yb in DataLoader(TensorDataset(test.x, test.y), batch_size=1000):
                correct += int((model(xb).argmax(1) == yb).sum())
        acc = correct / test.num_examples
        round_s.append(time.perf_counter() - t0)
    return round_s, acc


def forward_flops(model: torch.nn.Module, shape: tuple[int, ...] = (1, 28, 28)) -> int:
    """FLOPs of one forward pass of one sample of ``shape`` (counted, not estimated)."""
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, *shape))
    return int(counter.get_total_flops())


def matmul_gflops(repeats: int = 5) -> float:
    """The best fp32 matmul throughput of this process (GFLOP/s), large square and batched."""
    best = 0.0
    shapes = [((2048, 2048), (2048, 2048)), ((100, 64, 784), (100, 784, 128))]
    for a_shape, b_shape in shapes:
        a, b = torch.randn(*a_shape), torch.randn(*b_shape)
        flops = 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
        torch.matmul(a, b)  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            best = max(best, flops / (time.perf_counter() - t0) / 1e9)
    return best


def worker(name: str, runner_name: str, rounds: int, data_root: str, seed: int) -> dict[str, Any]:
    """One repeat of (workload, runner) in this process: start-up, the rounds, the FLOP count
    and this process's matmul throughput and peak RSS."""
    wl, runner = WORKLOADS[name], RUNNERS[runner_name]
    t0 = time.perf_counter()
    data, model, source = start_up(wl, data_root, seed)
    startup = time.perf_counter() - t0
    if runner.kind == "plain":
        # the process-wide malloc setting the library's backends apply (a research loop can set
        # it too: MALLOC_MMAP_THRESHOLD_); without it its speed jumped between runs (docs/speed.md)
        allocator.tune()
        round_s, acc = run_plain(wl, data, model, rounds, seed)
    else:
        round_s, acc = run_library(wl, data, model, rounds, seed, runner.backend, runner.algorithm)
    fwd = forward_flops(model, wl.shape)
    train_samples = wl.n_train // wl.clients * wl.per_round
    round_flops = 3 * fwd * train_samples + fwd * data.global_test.num_examples
    return {
        "data": source,
        "startup_s": startup,
        "round_s": round_s,
        "final_accuracy": acc,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "forward_flops": fwd,
        "round_gflop": round_flops / 1e9,
        "matmul_gflops": matmul_gflops(),
        "threads": torch.get_num_threads(),
    }


def summarize(name: str, runner_name: str, reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Repeats (one process each) of (workload, runner): medians of the steady rounds (2..) of
    every repeat pooled, of round 1 and of start-up; the largest peak RSS."""
    runner = RUNNERS[runner_name]
    steady = [s for rep in reps for s in (rep["round_s"][1:] or rep["round_s"])]
    last = reps[-1]
    return {
        "workload": name,
        "runner": runner_name,
        "data": last["data"],  # "synthetic": W3 without CIFAR-10 on disk (shapes only)
        "algorithm": runner.algorithm if runner.kind == "library" else "fedavg",
        "round_s_median": statistics.median(steady),
        "round1_s_median": statistics.median(rep["round_s"][0] for rep in reps),
        "startup_s": statistics.median(rep["startup_s"] for rep in reps),
        "peak_rss_mib": max(rep["peak_rss_mib"] for rep in reps),
        "final_accuracy": last["final_accuracy"],
        "forward_flops": last["forward_flops"],
        "round_gflop": last["round_gflop"],
        "matmul_gflops": max(rep["matmul_gflops"] for rep in reps),
        "threads": last["threads"],
        "env": dict(runner.env),
        "repeats": reps,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument(
        "--runners",
        nargs="+",
        default=None,
        choices=list(RUNNERS),
        help="default: every runner on W1; vectorized, sequential and plain on W2",
    )
    p.add_argument("--rounds", type=int, default=None, help="default: W1 20, W2 5, W3 3")
    p.add_argument("--repeats", type=int, default=3, help="processes per (workload, runner)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0)
    root = os.environ.get(DATA_ROOT_ENV) or str(REPO.parent / "shared" / "data")
    p.add_argument("--data-root", default=root)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "RUNNER"), help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:  # one repeat of one (workload, runner) in this process: its own peak RSS
        rounds = args.rounds or WORKLOADS[args.worker[0]].rounds
        result = worker(*args.worker, rounds, args.data_root, args.seed)
        args.out.write_text(json.dumps(result))
        return
    results: list[dict[str, Any]] = []
    for name in args.workloads:
        rounds = args.rounds or WORKLOADS[name].rounds
        runners = args.runners or DEFAULT_RUNNERS[name]
        reps: dict[str, list[dict[str, Any]]] = {r: [] for r in runners}
        for _ in range(args.repeats):  # interleaved: a noisy spell of a shared host hits all
            for runner in runners:
                with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
                    cmd = [sys.executable, __file__, "--worker", name, runner, "--out", tmp.name]
                    cmd += ["--rounds", str(rounds), "--seed", str(args.seed)]
                    cmd += ["--data-root", args.data_root]
                    if args.threads:
                        cmd += ["--threads", str(args.threads)]
                    env = {**os.environ, **dict(RUNNERS[runner].env)}
                    subprocess.run(cmd, check=True, env=env)
                    reps[runner].append(json.loads(Path(tmp.name).read_text()))
        results.extend(summarize(name, runner, reps[runner]) for runner in runners)
    report(results)  # (fills each result's bound_s from its workload's best matmul)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "results": results},
                indent=2,
                default=str,
            )
            + "\n"
        )


def report(results: list[dict[str, Any]]) -> None:
    table = Table(title="fedcomm backends vs a plain PyTorch loop vs the FLOP lower bound")
    for col in (
        "workload",
        "runner",
        "s/round (median)",
        "round 1 s",
        "start-up s",
        "peak RSS MiB",
        "final acc",
        "x FLOP bound",
        "plain / this",
        "sequential / this",
        "this / vectorized FedAvg",
    ):
        table.add_column(col, justify="right")
    by = {(r["workload"], r["runner"]): r["round_s_median"] for r in results}
    # one bound per workload: its round's FLOPs at the best matmul throughput any of its
    # processes measured (the machine's, not a noisy moment's)
    best = {
        wl: max(r["matmul_gflops"] for r in results if r["workload"] == wl)
        for wl in {r["workload"] for r in results}
    }
    for r in results:
        r["bound_s"] = r["round_gflop"] / best[r["workload"]]  # GFLOP / (GFLOP/s)
    for r in results:
        wl, t = r["workload"], r["round_s_median"]

        def ratio(a: float | None, b: float | None) -> str:
            return "-" if a is None or b is None else f"{a / b:.2f}x"

        table.add_row(
            wl,
            r["runner"],
            f"{t:.4f}",
            f"{r['round1_s_median']:.3f}",
            f"{r['startup_s']:.2f}",
            f"{r['peak_rss_mib']:.0f}",
            f"{100 * r['final_accuracy']:.2f}%",
            f"{t / r['bound_s']:.2f}x",
            ratio(by.get((wl, "plain")), t),
            ratio(by.get((wl, "sequential")), t),
            ratio(t, by.get((wl, "vectorized"))),
        )
    console = Console(width=max(Console().width, 160))
    console.print(table)
    for name in sorted({r["workload"] for r in results}):
        r = next(x for x in results if x["workload"] == name)
        console.print(
            f"{name}: {r['forward_flops']:,} forward FLOPs/sample, {r['round_gflop']:.2f} GFLOP "
            f"per round, best matmul {best[name]:.1f} GFLOP/s -> bound "
            f"{r['bound_s']:.4f} s/round ({r['threads']} threads)"
        )
    console.print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
