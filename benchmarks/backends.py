"""Backend benchmark: the library's backends against a plain PyTorch loop and a FLOP bound.

Workloads (MNIST train images from the data root, IID; the 10,000 test images evaluated every
round; 1 local epoch of plain SGD, server SGD lr 1):

- W1: MLP 784-128-10, 1000 clients x 60 samples, 100 clients per round, batch 10, lr 0.05;
- W2: the LeNet-like `cnn` (conv 5x5x32, conv 5x5x64, fc 512, 582,026 parameters),
  100 clients x 600 samples, 10 clients per round, batch 32, lr 0.05;
- W3, paper size (FedSparse's CIFAR-10 LeNet-5, ``pipeline/reproductions/fedsparse_cifar10.yaml``):
  the same ``cnn`` on 3x32x32 inputs (878,538 parameters), CIFAR-10's 50,000 training images
  IID over 100 clients, 10 per round, batch 64, lr 0.05, its 10,000 test images. Read from the
  data root: the python batches (``cifar-10-batches-py/``) when there, else the JPEG copy
  (``cifar10_jpeg/``, the ``image_folder`` loader), else random tensors of the same shapes
  (seeded; the speed is the same, the accuracy is chance): the result's ``data`` says which.

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

``--device cuda`` (or ``cuda:N``, ``mps``) runs every runner there: the library with
``train.device``, the plain loop with its model on the device and each batch moved there (as
research code does); timings wait for the device (``synchronize``), and each repeat reports its
peak device memory. The FLOP bound then uses the device's own matmul throughput.

    python benchmarks/backends.py [--workloads W1 W2] [--runners vectorized sequential plain ...]
                                  [--rounds N] [--repeats 3] [--threads N] [--device cpu]
                                  [--json out.json]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
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
from fedcomm.algorithms.core import ClientData
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.data.datasets.registry import load_dataset
from fedcomm.data.datasets.verify import DATA_ROOT_ENV, DatasetNotFoundError
from fedcomm.data.federated import PartitionSpec, make_partition
from fedcomm.data.types import Dataset
from fedcomm.models import build_model
from fedcomm.seeding import Stream, torch_generator
from fedcomm.simulation import allocator, device, loop
from fedcomm.simulation.data import FederatedTensors

REPO = Path(__file__).resolve().parents[1]
CPU = torch.device("cpu")


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
    "minimal": Runner("minimal"),
    "plain-no-malloc-tuning": Runner("plain", env=NO_TUNING),
    "vectorized-fedsparse": Runner("library", "vectorized", "fedsparse"),
    "vectorized-fedbiad": Runner("library", "vectorized", "fedbiad"),
    "vectorized-feddst": Runner("library", "vectorized", "feddst"),
    "vectorized-no-malloc-tuning": Runner("library", "vectorized", env=NO_TUNING),
    "sequential-no-malloc-tuning": Runner("library", "sequential", env=NO_TUNING),
}
DEFAULT_RUNNERS = {
    "W1": list(RUNNERS),  # (minimal runs on equal-sized clients only: W1, W3)
    "W2": ["vectorized", "sequential", "plain"],
    "W3": ["vectorized", "sequential", "plain", "minimal"],
}


# where a workload's dataset may be read, in order: (registered loader, its options, label)
SOURCES: dict[str, list[tuple[str, dict[str, Any], str]]] = {
    "mnist": [("mnist", {}, "mnist")],
    # the python batches when present, else the JPEG copy of the shared data root (quality 75:
    # the same shapes and about the same accuracy; cifar10_jpeg/README.md)
    "cifar10": [
        ("cifar10", {}, "cifar10"),
        ("image_folder", {"path": "cifar10_jpeg"}, "cifar10_jpeg"),
    ],
}


def _pool(wl: Workload, data_root: str, seed: int) -> tuple[Dataset, str]:
    """The workload's dataset (official train rows first, then test) and where it came from:
    the first of its :data:`SOURCES` under the data root, else (W3 only) random tensors."""
    if wl.dataset == "mnist":
        return load_dataset("mnist", data_root), "mnist"
    for loader, options, label in SOURCES.get(wl.dataset, []):
        try:
            return load_dataset(loader, data_root, **options), label
        except DatasetNotFoundError:
            continue
    # same shapes, random values: the speed does not change, the accuracy is chance
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
    gen = torch_generator(seed, Stream.INIT)  # as stages.train.build_run_model seeds it
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
    dev: torch.device = CPU,
    cpu_s: list[float] | None = None,
    compile: str = "none",
) -> tuple[list[float], float]:
    """``rounds`` rounds of ``loop.run``: each round's wall seconds and the final accuracy;
    ``cpu_s``, when given, receives each round's process CPU seconds (all threads);
    ``compile``: ``train.compile``."""
    local = LocalConfig(epochs=1, batch_size=wl.batch, lr=wl.lr)
    cfg = loop.LoopConfig(
        rounds, wl.per_round, local, seed, eval_every=1, backend=backend, device=str(dev),
        compile=compile,
    )  # fmt: skip
    config = CONFIGS[algorithm_name]().with_rounds(rounds)  # the algorithm's defaults
    algorithm, compressor = build_algorithm(config), build_compressor("none")
    stamps: list[float] = []
    cpu_stamps: list[float] = []
    t0, c0 = time.perf_counter(), time.process_time()

    def tick(r: int, m: Any) -> None:
        device.synchronize(dev)
        stamps.append(time.perf_counter())
        cpu_stamps.append(time.process_time())

    result = loop.run(
        cfg,
        algorithm,
        model,
        data,
        compressor,
        config_hash="bench",
        progress=tick,
    )
    round_s = [b - a for a, b in zip([t0, *stamps[:-1]], stamps, strict=True)]
    if cpu_s is not None:
        cpu_s.extend(b - a for a, b in zip([c0, *cpu_stamps[:-1]], cpu_stamps, strict=True))
    return round_s, float(result.state.round_rows[-1]["global/accuracy"])


def run_plain(
    wl: Workload,
    data: FederatedTensors,
    model: torch.nn.Module,
    rounds: int,
    seed: int,
    dev: torch.device = CPU,
    cpu_s: list[float] | None = None,
) -> tuple[list[float], float]:
    """A typical research-code FedAvg loop (same cohorts as the library); on an accelerator the
    model lives there and every batch is moved there, the data staying in host memory.
    ``cpu_s``: as :func:`run_library`'s."""
    model.to(dev)
    gen = torch.Generator().manual_seed(seed)
    round_s: list[float] = []
    acc = 0.0
    for r in range(1, rounds + 1):
        t0, c0 = time.perf_counter(), time.process_time()
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
                xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
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
                xb, yb = xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)
                correct += int((model(xb).argmax(1) == yb).sum())
        acc = correct / test.num_examples
        round_s.append(time.perf_counter() - t0)
        if cpu_s is not None:
            cpu_s.append(time.process_time() - c0)
    return round_s, acc


def run_minimal(
    wl: Workload,
    data: FederatedTensors,
    model: torch.nn.Module,
    rounds: int,
    seed: int,
    dev: torch.device = CPU,
    cpu_s: list[float] | None = None,
) -> tuple[list[float], float]:
    """The least a batched FedAvg round can do: the cohort's weights stacked, every local step one
    ``vmap(grad(functional_call))`` and one fused SGD update of the stacked tensors, the mean of
    the stacked results, then the test-set evaluation. Same cohorts as the library; needs
    clients of equal size (every client has the same steps); batches shuffled per client."""
    model.to(dev)
    data = data.to(dev)
    names = [n for n, _ in model.named_parameters()]
    glob = {n: p.detach().clone() for n, p in model.named_parameters()}

    def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(torch.func.functional_call(model, params, (x,)), y)

    step = torch.func.vmap(torch.func.grad(loss))
    gen = torch.Generator().manual_seed(seed)
    round_s: list[float] = []
    acc = 0.0
    for r in range(1, rounds + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        cohort = loop.sample_cohort(seed, r, data.num_clients, wl.per_round)
        C = len(cohort)
        n = data.train[cohort[0]].num_examples
        if any(data.train[c].num_examples != n for c in cohort):
            raise SystemExit("the minimal runner needs clients of equal size")
        x = torch.stack([data.train[c].x for c in cohort])  # (C, n, ...)
        y = torch.stack([data.train[c].y for c in cohort])  # (C, n)
        order = torch.stack([torch.randperm(n, generator=gen) for _ in cohort]).to(dev)  # (C, n)
        live = {k: v.unsqueeze(0).repeat(C, *[1] * v.dim()) for k, v in glob.items()}
        for i in range(0, n, wl.batch):  # the last batch partial, as in the library
            idx = order[:, i : i + wl.batch]  # (C, B)
            xb = torch.gather(
                x, 1, idx.view(C, -1, *[1] * (x.dim() - 2)).expand(-1, -1, *x.shape[2:])
            )
            yb = torch.gather(y, 1, idx)
            grads = step(live, xb, yb)
            torch._foreach_add_([live[k] for k in names], [grads[k] for k in names], alpha=-wl.lr)
        glob = {k: v.mean(0) for k, v in live.items()}  # equal sizes: the weighted mean
        test = data.global_test
        correct = 0
        with torch.no_grad():
            for j in range(0, test.num_examples, 2048):
                out = torch.func.functional_call(model, glob, (test.x[j : j + 2048],))
                correct += int((out.argmax(1) == test.y[j : j + 2048]).sum())
        acc = correct / test.num_examples
        device.synchronize(dev)
        round_s.append(time.perf_counter() - t0)
        if cpu_s is not None:
            cpu_s.append(time.process_time() - c0)
    return round_s, acc


def forward_flops(model: torch.nn.Module, shape: tuple[int, ...] = (1, 28, 28)) -> int:
    """FLOPs of one forward pass of one sample of ``shape`` (counted, not estimated)."""
    ref = next(model.parameters())
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(torch.zeros(1, *shape, device=ref.device))
    return int(counter.get_total_flops())


def matmul_gflops(repeats: int = 5, dev: torch.device = CPU, cpu_clock: bool = False) -> float:
    """The best fp32 matmul throughput of this process (GFLOP/s) on ``dev``, large square and
    batched; with ``cpu_clock``, per second of process CPU time (all threads) instead of wall
    time: GFLOP per CPU-second, the rate a loaded, shared host cannot take from the process."""
    clock = time.process_time if cpu_clock else time.perf_counter
    best = 0.0
    shapes = [((2048, 2048), (2048, 2048)), ((100, 64, 784), (100, 784, 128))]
    for a_shape, b_shape in shapes:
        a, b = torch.randn(*a_shape, device=dev), torch.randn(*b_shape, device=dev)
        flops = 2 * a.shape[-2] * a.shape[-1] * b.shape[-1] * (a.shape[0] if a.dim() == 3 else 1)
        torch.matmul(a, b)  # warm-up
        device.synchronize(dev)
        for _ in range(repeats):
            t0 = clock()
            torch.matmul(a, b)
            device.synchronize(dev)
            best = max(best, flops / (clock() - t0) / 1e9)
    return best


def stream_gbps(dev: torch.device = CPU, repeats: int = 5, numel: int = 1 << 26) -> float:
    """The best memory bandwidth of ``c = a + b`` on 256 MiB float32 tensors (GB/s; 3 x 256 MiB
    moved per call: two reads and a write), STREAM's "add" kernel on this process's threads."""
    a, b = torch.ones(numel, device=dev), torch.ones(numel, device=dev)
    c = torch.empty(numel, device=dev)
    torch.add(a, b, out=c)  # first touch
    device.synchronize(dev)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        torch.add(a, b, out=c)
        device.synchronize(dev)
        best = max(best, 3 * 4 * numel / (time.perf_counter() - t0) / 1e9)
    return best


def round_traffic_bytes(wl: Workload, model: torch.nn.Module, test_examples: int) -> int:
    """A lower bound on the DRAM traffic of one FedAvg round (bytes), for the roofline: every
    local step of every client must read its weights (forward), write its weight gradient
    (backward), and read both and write the weights (SGD update): 4 weight-sized passes, each of
    the cohort's own copy (they differ after the first step, and a 100-client chunk of the MLP is
    40 MB per pass, beyond the caches); plus its input batch read once. The evaluation reads the
    test set once. Activations of a small batch are assumed to stay in cache (not counted)."""
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    n = wl.n_train // wl.clients  # examples per client (IID, equal)
    steps = -(-n // wl.batch)
    input_bytes = 4 * math.prod(wl.shape)  # one float32 example
    per_client = steps * 4 * param_bytes + n * input_bytes
    return wl.per_round * per_client + test_examples * input_bytes + param_bytes


def worker(
    name: str, runner_name: str, rounds: int, data_root: str, seed: int, device_name: str = "cpu"
) -> dict[str, Any]:
    """One repeat of (workload, runner) in this process: start-up, the rounds, the FLOP count
    and this process's matmul throughput, peak RSS and peak device memory."""
    wl, runner = WORKLOADS[name], RUNNERS[runner_name]
    dev = device.resolve(device_name)
    t0 = time.perf_counter()
    data, model, source = start_up(wl, data_root, seed)
    startup = time.perf_counter() - t0
    cpu_s: list[float] = []
    if runner.kind in ("plain", "minimal"):
        # the process-wide malloc setting the library's backends apply (a research loop can set
        # it too: MALLOC_MMAP_THRESHOLD_); without it its speed jumped between runs (docs/speed.md)
        allocator.tune()
        plain = run_plain if runner.kind == "plain" else run_minimal
        round_s, acc = plain(wl, data, model, rounds, seed, dev, cpu_s)
    else:
        round_s, acc = run_library(
            wl, data, model, rounds, seed, runner.backend, runner.algorithm, dev, cpu_s
        )
    fwd = forward_flops(model, wl.shape)
    train_samples = wl.n_train // wl.clients * wl.per_round
    round_flops = 3 * fwd * train_samples + fwd * data.global_test.num_examples
    traffic = round_traffic_bytes(wl, model, data.global_test.num_examples)
    return {
        "data": source,
        "startup_s": startup,
        "round_s": round_s,
        "round_cpu_s": cpu_s,  # process CPU seconds per round (all threads, spin-waits too)
        "loadavg_1min": os.getloadavg()[0],  # the host's load as the repeat ended (shared)
        "final_accuracy": acc,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "forward_flops": fwd,
        "round_gflop": round_flops / 1e9,
        "round_traffic_gb": traffic / 1e9,
        "stream_gbps": stream_gbps(dev),
        "matmul_gflops": matmul_gflops(dev=dev),
        "matmul_gflops_per_cpu_s": matmul_gflops(dev=dev, cpu_clock=True) if dev == CPU else None,
        "threads": torch.get_num_threads(),
        "device": device_label(dev),
        "peak_device_mib": torch.cuda.max_memory_allocated(dev) / 2**20
        if dev.type == "cuda"
        else None,
    }


def device_label(dev: torch.device) -> str:
    """The device's name as a reader knows it (the GPU's model for CUDA)."""
    if dev.type == "cuda":
        return f"{dev} ({torch.cuda.get_device_name(dev)})"
    return str(dev)


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
        "round_cpu_s_median": statistics.median(
            s for rep in reps for s in (rep["round_cpu_s"][1:] or rep["round_cpu_s"])
        ),
        "loadavg_1min": [rep["loadavg_1min"] for rep in reps],
        "startup_s": statistics.median(rep["startup_s"] for rep in reps),
        "peak_rss_mib": max(rep["peak_rss_mib"] for rep in reps),
        "device": last.get("device", "cpu"),
        "peak_device_mib": max((rep.get("peak_device_mib") or 0.0) for rep in reps) or None,
        "final_accuracy": last["final_accuracy"],
        "forward_flops": last["forward_flops"],
        "round_gflop": last["round_gflop"],
        "round_traffic_gb": last["round_traffic_gb"],
        "stream_gbps": max(rep["stream_gbps"] for rep in reps),
        "matmul_gflops": max(rep["matmul_gflops"] for rep in reps),
        "matmul_gflops_per_cpu_s": max((rep.get("matmul_gflops_per_cpu_s") or 0.0) for rep in reps),
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
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda, cuda:N or mps: where every runner trains (default cpu)",
    )
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
        result = worker(*args.worker, rounds, args.data_root, args.seed, args.device)
        args.out.write_text(json.dumps(result))
        return
    device.resolve(args.device)  # a device this machine lacks: the error now, not per worker
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
                    cmd += ["--data-root", args.data_root, "--device", args.device]
                    if args.threads:
                        cmd += ["--threads", str(args.threads)]
                    env = {**os.environ, **dict(RUNNERS[runner].env)}
                    subprocess.run(cmd, check=True, env=env)
                    reps[runner].append(json.loads(Path(tmp.name).read_text()))
        results.extend(summarize(name, runner, reps[runner]) for runner in runners)
    report(results)  # (fills each result's bound_s from its workload's best matmul)
    if args.json is not None:
        # relative to the repository, so a committed result names no path of this machine
        shown = os.path.relpath(args.data_root, REPO)
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args) | {"json": str(args.json), "data_root": shown},
                    "results": results,
                },
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
        "CPU s/round",
        "round 1 s",
        "start-up s",
        "peak RSS MiB",
        "peak device MiB",
        "final acc",
        "x FLOP bound",
        "CPU x FLOP bound (CPU s)",
        "x memory bound",
        "plain / this",
        "sequential / this",
        "this / vectorized FedAvg",
        "this / minimal",
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
    # the same bound in CPU seconds (GFLOP per CPU-second of the best matmul): on a shared,
    # loaded host the CPU time of a round is what its code costs, the wall time is not
    best_cpu = {
        wl: max(r.get("matmul_gflops_per_cpu_s") or 0.0 for r in results if r["workload"] == wl)
        for wl in {r["workload"] for r in results}
    }
    for r in results:
        rate = best_cpu[r["workload"]]
        r["bound_cpu_s"] = r["round_gflop"] / rate if rate else None
    bandwidth = {
        wl: max(r["stream_gbps"] for r in results if r["workload"] == wl)
        for wl in {r["workload"] for r in results}
    }
    for r in results:
        r["memory_bound_s"] = r["round_traffic_gb"] / bandwidth[r["workload"]]  # GB / (GB/s)
    for r in results:
        wl, t = r["workload"], r["round_s_median"]

        def ratio(a: float | None, b: float | None) -> str:
            return "-" if a is None or b is None else f"{a / b:.2f}x"

        table.add_row(
            wl,
            r["runner"],
            f"{t:.4f}",
            f"{r['round_cpu_s_median']:.3f}",
            f"{r['round1_s_median']:.3f}",
            f"{r['startup_s']:.2f}",
            f"{r['peak_rss_mib']:.0f}",
            "-" if r.get("peak_device_mib") is None else f"{r['peak_device_mib']:.0f}",
            f"{100 * r['final_accuracy']:.2f}%",
            f"{t / r['bound_s']:.2f}x",
            "-" if not r["bound_cpu_s"] else f"{r['round_cpu_s_median'] / r['bound_cpu_s']:.2f}x",
            f"{t / r['memory_bound_s']:.2f}x",
            ratio(by.get((wl, "plain")), t),
            ratio(by.get((wl, "sequential")), t),
            ratio(t, by.get((wl, "vectorized"))),
            ratio(t, by.get((wl, "minimal"))),
        )
    console = Console(width=max(Console().width, 160))
    console.print(table)
    for name in sorted({r["workload"] for r in results}):
        r = next(x for x in results if x["workload"] == name)
        console.print(
            f"{name}: {r['forward_flops']:,} forward FLOPs/sample, {r['round_gflop']:.2f} GFLOP "
            f"per round, best matmul {best[name]:.1f} GFLOP/s -> bound "
            f"{r['bound_s']:.4f} s/round ({r['threads']} threads); "
            f"{r['round_traffic_gb']:.3f} GB of least memory traffic per round at "
            f"{bandwidth[name]:.1f} GB/s (best c = a + b) -> bound {r['memory_bound_s']:.4f} "
            f"s/round; roofline bound max = {max(r['bound_s'], r['memory_bound_s']):.4f} s/round"
        )
    console.print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"device {results[0].get('device', 'cpu') if results else 'cpu'}, "
        f"torch {torch.__version__}, Python {platform.python_version()}"
    )


if __name__ == "__main__":
    main()
