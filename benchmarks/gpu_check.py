"""The GPU check: one prepared script that measures what a short loan of one GPU can show.

``make gpu-check`` (``benchmarks/gpu_check.sh``) installs the carried wheels and runs this. Each
part writes its numbers into one JSON file the moment it ends (atomically, so a run killed at
any point leaves every finished part's numbers); a part that fails records its error and the
next part runs; a global time budget (``--budget-s``) is shared out between the parts, and a
part or a run without time left is recorded as skipped.

Parts (``--parts``, in this order):

- ``env``: the GPU, torch, CUDA and cuDNN versions, free device memory, the packages used;
- ``contract``: the CUDA contract tests (``tests/contract/test_device.py -k cuda``: every
  algorithm on both backends, on the GPU against the CPU) in a pytest subprocess; pass / fail /
  skip counts and the failures' names;
- ``backends``: W1, W2 and W3 of ``benchmarks/backends.py`` (MNIST-shaped and CIFAR-10-shaped
  synthetic tensors) on ``--device`` and on this machine's CPU in the same run, each with the
  vectorized and the sequential backend and the plain PyTorch loop (on the GPU, W1 also with
  ``train.compile: reduce-overhead``: the batched step as CUDA graphs): s/round, peak memory, the
  sequential / vectorized ratio, the FLOP bound;
- ``profiles``: the first ``--rounds`` (20) rounds of every run of the paper-scale profiles
  (``pipeline/reproductions/{fedsparse_cifar10,feddst_cifar10,fedbiad_ptb,progfed_cifar100}``),
  read through ``fedcomm.config``, the dataset replaced by synthetic tensors of the same shapes,
  sizes and class counts (PTB: a random token stream of the real corpus's length and its
  10,000-word vocabulary), through ``fedcomm.simulation.loop.run`` (no MLflow, no DVC) with the
  profile's own cadence of evaluation: s/round, peak device memory, bytes sent, per algorithm;
- ``pfl``: pfl-research's CIFAR-10 benchmark workload (benchmarks/image_classification,
  ``configs/baseline.yaml``: ``cifar10_iid``, 1,000 clients of 50 images, 50 a round, B = 10,
  E = 1, local lr 0.1, FedAvg with server lr 1, its ``simple_cnn``), 20 rounds on the
  vectorized and the sequential backend and the plain loop, plus the vectorized backend on the
  same CNN without its dropout (what the dropout masks, drawn per client outside the batched
  step, cost); ``vectorized_fallback`` is the library's reason to train it one client at a time
  (None: it trains batched);
- ``shard``: one simulation on 1 and on 2 processes (``benchmarks/sharding.py --synthetic``: W1
  vectorized, W3 sequential, FedAvg; ranks share the one GPU, their exchanges go through host
  memory): s/round each, the speed-up, the bytes and seconds of the gathers, and whether the
  final model equals the one-process run's.

Data is synthetic everywhere (no dataset can travel with the check): the speed and the memory
do not depend on the values, and the accuracies are chance.

``--dry-run`` is ``--device cpu --rounds 1 --small``: every part and every code path on a CPU
in about a minute, with smaller datasets and cohorts (the models keep their size); the test
suite runs it (``tests/unit/test_gpu_check.py``).

    python benchmarks/gpu_check.py [--device cuda] [--budget-s 420] [--rounds N] [--small]
                                   [--parts env contract backends profiles pfl shard] [--out DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from fedcomm import atomic
from fedcomm.algorithms import build_algorithm
from fedcomm.algorithms.core import ClientData
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.config import Params, model_options, read_yaml_mapping, validate_params
from fedcomm.data.datasets.ptb import ptb_from_streams
from fedcomm.data.federated import PartitionSpec, make_partition
from fedcomm.data.types import Dataset
from fedcomm.errors import InputError
from fedcomm.models import build_model
from fedcomm.seeding import Stream, torch_generator
from fedcomm.simulation import backends as library_backends
from fedcomm.simulation import device, loop
from fedcomm.simulation.data import FederatedTensors
from fedcomm.stages.partition import partition_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # backends.py, beside this file
import backends

REPO = Path(__file__).resolve().parents[1]
PARTS = ("env", "contract", "backends", "profiles", "pfl", "shard")
# each part's share of the budget still left when it starts (a part that ends early leaves its
# time to the later ones); env takes no share (seconds)
SHARES = {
    "env": 0.0, "contract": 0.12, "backends": 0.22, "profiles": 0.40, "pfl": 0.16, "shard": 0.10,
}  # fmt: skip
MIN_SLICE_S = 3.0  # a part or a run with less time than this is skipped
MAX_WORKLOAD_ROUNDS = 10  # W1's 20 rounds cut to 10 (the median of 9 steady rounds), W2 5, W3 3
# profile values the check changes on the GPU too, each with its reason (recorded in the JSON)
CHECK_OVERRIDES: dict[str, dict[str, Any]] = {
    "feddst_cifar10": {
        # PruneFL's phase one (1000 single-client rounds before round 1) would take the whole
        # part's time; 20 show its cost per phase-one round in round 1's time
        "algorithms.prunefl.initial_rounds": 20,
    },
}
# runs the check adds to a profile: new run -> (the profile's run it copies, keys it changes)
CHECK_VARIANTS: dict[str, dict[str, tuple[str, dict[str, Any]]]] = {
    # FedBIAD's weight noise computed on the device (Philox), against its CPU generator's draws
    "fedbiad_ptb": {"fedbiad_counter_noise": ("fedbiad", {"noise": "counter"})},
}
PROFILES = ("fedsparse_cifar10", "feddst_cifar10", "fedbiad_ptb", "progfed_cifar100")
TEST_IMAGES = 10_000  # W1-W3 and pfl: the official test set's size
PTB_TOKENS = (887_521, 70_390, 78_669)  # Mikolov's train / valid / test (../shared/data)
PTB_VOCAB = 10_000
# the images of each dataset a profile names: (pooled official train + test, shape, classes);
# image_folder datasets by their path under the data root
IMAGES = {
    "cifar10": (60_000, (3, 32, 32), 10),
    "cifar100": (60_000, (3, 32, 32), 100),
    "image_folder:cifar10_jpeg": (60_000, (3, 32, 32), 10),  # CIFAR-10's JPEG copy
}

# --small (the CPU dry run): fewer examples and clients, narrower LSTM; the same code paths
SMALL_IMAGES = {
    "fedsparse_cifar10": 500,  # 10 clients of ~50
    "feddst_cifar10": 1_000,  # 400 in the shards of 10 clients, 20 test rows a class
    "progfed_cifar100": 500,  # 5 clients of 4 classes (the other 80 dropped), ~20 rows each
}
SMALL_TEST = 200
SMALL_PER_CLIENT = 60  # W1-W3 and pfl: at most this many examples a client
SMALL_TOKENS_DIVISOR = 100  # (and so fewer than 10,000 distinct words)
SMALL_PROFILE: dict[str, dict[str, Any]] = {
    "fedsparse_cifar10": {
        "partition.num_partitions": 10,
        "partition.min_partition_size": 20,
        "train.clients_per_round": 2,
    },
    "feddst_cifar10": {
        "partition.num_partitions": 10,  # 400 of the 1,000 images in shards, 200 test rows
        "partition.test_per_class": 20,
        "train.clients_per_round": 2,
        "train.local.epochs": 1,
        "algorithms.prunefl.initial_rounds": 2,
    },
    "fedbiad_ptb": {
        "partition.num_partitions": 10,
        "train.clients_per_round": 2,
        "model.embed_dim": 32,
        "model.hidden": 32,
    },
    "progfed_cifar100": {
        "partition.num_partitions": 5,
        "partition.num_classes_per_partition": 4,
        "train.clients_per_round": 1,
    },
}

log = logging.getLogger("gpu_check")


class Terminated(BaseException):
    """SIGTERM (the launcher's ``timeout``): the running part is recorded as stopped."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


class OutOfTime(Exception):
    """Raised from a run's progress callback once its time slice is spent."""


@dataclasses.dataclass
class Budget:
    """The global time budget and the share of it each part gets."""

    total_s: float
    start: float = dataclasses.field(default_factory=time.perf_counter)

    def left(self) -> float:
        return self.total_s - (time.perf_counter() - self.start)

    def part_slice(self, part: str, parts: list[str]) -> float:
        """The part's share of what is left: its weight over the weights of it and the parts
        after it."""
        rest = parts[parts.index(part) :]
        weight = sum(SHARES[p] for p in rest)
        return self.left() * (SHARES[part] / weight if weight else 1.0)


class Report:
    """The JSON file, rewritten atomically after every part and every run."""

    def __init__(self, path: Path, header: dict[str, Any]) -> None:
        self.path = path
        self.data: dict[str, Any] = {**header, "parts": {}, "finished": False}
        self.save()

    def part(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = self.data["parts"].setdefault(name, {"status": "running"})
        return node

    def save(self) -> None:
        atomic.write_json(self.path, self.data)


@dataclasses.dataclass
class Result:
    """A part's result node, already inside the report: the part fills ``data`` and calls
    ``save()`` after each run, so a stopped part keeps every run it finished."""

    data: dict[str, Any]
    save: Callable[[], None]


# --- helpers ----------------------------------------------------------------------------------


def steady(round_s: list[float]) -> float | None:
    """Median s/round over rounds 2.. (round 1 pays the warm-up), round 1 if it is the only."""
    rest = round_s[1:] or round_s
    return statistics.median(rest) if rest else None


def peak_reset(dev: torch.device) -> None:
    gc.collect()
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def peak_memory(dev: torch.device) -> dict[str, float | None]:
    """Peak device memory since :func:`peak_reset` (CUDA), and this process's peak RSS so far
    (cumulative over the whole check: the CPU has no per-run peak in one process)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cuda = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None
    return {"peak_device_mib": cuda, "process_peak_rss_mib": rss}


def seeded_model(seed: int, build: Callable[[], nn.Module]) -> nn.Module:
    """A model initialised as ``stages.train.build_run_model`` seeds it: from ``(seed, INIT)``."""
    gen = torch_generator(seed, Stream.INIT)
    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    return build()


def synthetic_images(name: str, n: int, shape: tuple[int, ...], classes: int, seed: int) -> Dataset:
    """``n`` images uniform in [0, 1) (as the loaders scale them), balanced shuffled labels."""
    g = np.random.default_rng(seed)
    x = g.random((n, *shape), dtype=np.float32)  # (n, C, H, W)
    y = g.permutation(np.arange(n, dtype=np.int64) % classes)
    return Dataset(name, x, y, classes)


def synthetic_ptb(seq_len: int, divisor: int, seed: int) -> Dataset:
    """Random tokens in streams of PTB's lengths over a vocabulary of its 10,000 words, windowed
    by the PTB loader's own code (``ptb_from_streams``)."""
    g = np.random.default_rng(seed)
    streams = []
    for i, n in enumerate(PTB_TOKENS):
        ids = g.integers(0, PTB_VOCAB, max(n // divisor, 2 * seq_len))
        if i == 0 and len(ids) >= PTB_VOCAB:  # every word occurs: the vocabulary is full
            ids[:PTB_VOCAB] = g.permutation(PTB_VOCAB)
        streams.append([f"w{t}" for t in ids.tolist()])
    return ptb_from_streams(streams, seq_len=seq_len)


def federate(dataset: Dataset, spec: PartitionSpec) -> FederatedTensors:
    part = make_partition(dataset, spec)
    return FederatedTensors.build(dataset, part.train, part.test)


class Collect(logging.Handler):
    """The messages of the log records it is given."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def timed_run(
    cfg: loop.LoopConfig,
    algorithm: Any,
    model: nn.Module,
    data: FederatedTensors,
    compressor: Any,
    dev: torch.device,
    deadline: float,
) -> dict[str, Any]:
    """``loop.run`` with a stop once ``deadline`` (perf_counter) has passed: the rounds done,
    s/round, peak memory, bytes per round, the last global metrics."""
    stamps: list[float] = []
    rows: list[dict[str, Any]] = []

    def progress(round_: int, metrics: Mapping[str, float | None]) -> None:
        device.synchronize(dev)
        stamps.append(time.perf_counter())
        rows.append({**metrics, "round": round_})
        if time.perf_counter() > deadline and round_ < cfg.rounds:
            raise OutOfTime(f"stopped after round {round_} of {cfg.rounds}: time slice spent")

    peak_reset(dev)
    t0 = time.perf_counter()
    stopped = None
    heard = Collect()
    backend_log = logging.getLogger("fedcomm.backend")
    level = backend_log.level
    backend_log.setLevel(logging.INFO)
    backend_log.addHandler(heard)
    try:
        result = loop.run(
            cfg, algorithm, model, data, compressor, config_hash="gpu-check", progress=progress
        )
        effective = result.backend
    except OutOfTime as err:  # the backend said at its start whether it falls back
        stopped = str(err)
        fell_back = any("runs sequentially" in m for m in heard.messages)
        effective = "sequential" if fell_back else cfg.backend
    finally:
        backend_log.removeHandler(heard)
        backend_log.setLevel(level)
    round_s = [b - a for a, b in zip([t0, *stamps[:-1]], stamps, strict=True)]
    evals = [r for r in rows if r.get("global/accuracy") is not None]
    last_eval = evals[-1] if evals else {}
    up = [r["comm/up_bytes"] for r in rows if r.get("comm/up_bytes") is not None]
    down = [r["comm/down_bytes"] for r in rows if r.get("comm/down_bytes") is not None]
    return {
        "rounds": cfg.rounds,
        "rounds_done": len(stamps),
        "stopped": stopped,
        "backend": cfg.backend,
        "backend_ran": effective,
        "backend_log": heard.messages,
        "round_s": round_s,
        "s_per_round": steady(round_s),
        "round1_s": round_s[0] if round_s else None,
        "eval_rounds": [r["round"] for r in evals],
        "global_accuracy": last_eval.get("global/accuracy"),
        "topk_accuracy": last_eval.get("topk/accuracy"),
        "up_bytes_per_round": statistics.mean(up) if up else None,
        "down_bytes_per_round": statistics.mean(down) if down else None,
        **peak_memory(dev),
    }


# --- part 1: environment -----------------------------------------------------------------------


def package_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in (
        "torch",
        "numpy",
        "pydantic",
        "pydantic-core",
        "polars",
        "pyyaml",
        "rich",
        "pytest",
        "scikit-learn",
    ):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def part_env(args: argparse.Namespace, dev: torch.device, deadline: float, res: Result) -> None:
    env: dict[str, Any] = {
        "device": str(dev),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "glibc": "-".join(platform.libc_ver()),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3]
        if Path("/proc/loadavg").exists()
        else None,
        "torch": torch.__version__,
        "cuda_available": torch.cuda.is_available(),
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "packages": package_versions(),
        "git_commit": git_commit(),
        "source_sha256": source_digest(),
    }
    if dev.type == "cuda":
        free, total = torch.cuda.mem_get_info(dev)
        prop = torch.cuda.get_device_properties(dev)
        env |= {
            "gpu": torch.cuda.get_device_name(dev),
            "gpu_count": torch.cuda.device_count(),
            "capability": ".".join(map(str, torch.cuda.get_device_capability(dev))),
            "multiprocessors": prop.multi_processor_count,
            "memory_total_mib": total / 2**20,
            "memory_free_mib": free / 2**20,
            "tf32_matmul": getattr(torch.backends.cuda.matmul, "allow_tf32", None),
            "tf32_cudnn": getattr(torch.backends.cudnn, "allow_tf32", None),
        }
    res.data.update(env)


def source_digest() -> str:
    """sha256 of ``src/fedcomm/**/*.py`` (paths and bytes): which code ran, without ``.git``."""
    h = hashlib.sha256()
    for path in sorted((REPO / "src" / "fedcomm").rglob("*.py")):
        h.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None  # (the GPU machine gets a copy of the working tree, maybe without .git)
    return out.stdout.strip()


# --- part 2: the CUDA contract tests -------------------------------------------------------------

CONTRACT_ARGS = ["tests/contract/test_device.py", "-k", "cuda"]


def part_contract(
    args: argparse.Namespace, dev: torch.device, deadline: float, res: Result
) -> None:
    """The tests in a pytest subprocess that writes each outcome as it happens: a run stopped
    at the end of its time slice still reports the tests it finished."""
    with tempfile.TemporaryDirectory() as tmp:
        outcomes = Path(tmp) / "outcomes.txt"
        cmd = [sys.executable, __file__, "--contract-worker", str(outcomes)]
        t0 = time.perf_counter()
        timed_out = False
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                  timeout=max(1.0, deadline - time.perf_counter()))  # fmt: skip
            code, output = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as err:
            timed_out, code = True, None
            raw = err.stdout or b""  # (bytes, whatever text= says)
            output = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        for line in output.splitlines()[-40:]:
            log.info("  pytest: %s", line)
        counts = outcome_counts(outcomes.read_text() if outcomes.is_file() else "")
    digits = [
        line.removeprefix("digits: ") for line in output.splitlines() if line.startswith("digits: ")
    ]
    counts |= {
        "exit_code": code,
        "timed_out": timed_out,
        "seconds": time.perf_counter() - t0,
        "args": CONTRACT_ARGS,
        "digits": digits[0] if digits else None,
    }
    if timed_out:
        raise PartFailed(
            f"stopped at the end of its time slice after {counts['ran']} tests", counts
        )
    if counts["failed"] or counts["errors"] or code != 0 or not counts["ran"]:
        raise PartFailed(
            f"{counts['failed']} failed, {counts['errors']} errors, exit {code}", counts
        )
    res.data.update(counts)


class PartFailed(Exception):
    """A part that ran and measured something wrong (or not all): its result is kept."""

    def __init__(self, message: str, result: dict[str, Any]) -> None:
        super().__init__(message)
        self.result = result


def outcome_counts(lines: str) -> dict[str, Any]:
    """passed / failed / errors / skipped and the tests that did not pass, from the worker's
    ``<outcome> <test id>`` lines."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    bad: list[str] = []
    for line in lines.splitlines():
        outcome, _, test = line.partition(" ")
        counts[outcome] += 1
        if outcome in ("failed", "errors"):
            bad.append(test)
    return {**counts, "ran": sum(counts.values()), "not_passed": bad}


class OutcomeWriter:
    """A pytest plugin: one ``<outcome> <test id>`` line per test, flushed as it is known."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "w", encoding="utf-8")  # noqa: SIM115 (closed at session end)

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when == "call" or report.outcome != "passed":  # setup errors and skips too
            kind = "errors" if report.failed and report.when != "call" else report.outcome
            self.file.write(f"{kind} {report.nodeid}\n")
            self.file.flush()

    def pytest_sessionfinish(self) -> None:
        self.file.close()


def contract_worker(outcomes: str) -> int:
    """Run the CUDA contract tests in this process (the ``--contract-worker`` mode). Without
    scikit-learn (the GPU machine has none), its ``load_digits`` is read from the file that
    scikit-learn bundles, carried beside the wheels: the same 1,797 digits, bit for bit."""
    import pytest

    try:
        import sklearn.datasets  # noqa: F401

        print("digits: scikit-learn")
    except ImportError:
        carried = REPO / os.environ.get("GPU_WHEELS", ".gpu-wheels") / "digits.csv.gz"
        install_digits(carried)
        print(f"digits: {carried.name} from the wheels (scikit-learn's file, without scikit-learn)")
    args = ["-q", "-p", "no:cacheprovider", *CONTRACT_ARGS]
    return int(pytest.main(args, plugins=[OutcomeWriter(outcomes)]))


def read_digits(path: Path) -> types.SimpleNamespace:
    """``sklearn.datasets.load_digits()`` as scikit-learn computes it from its bundled
    ``digits.csv.gz`` (64 pixel columns then the label, comma-separated): ``data``, ``target``,
    ``images``."""
    data = np.loadtxt(path, delimiter=",")  # (1797, 65) float64
    target = data[:, -1].astype(int, copy=False)
    flat = data[:, :-1]
    return types.SimpleNamespace(data=flat, target=target, images=flat.reshape(-1, 8, 8))


def install_digits(path: Path) -> None:
    """A ``sklearn.datasets`` module whose ``load_digits`` is :func:`read_digits` of ``path``,
    for the one loader that imports it (this process only: the contract-test worker)."""
    if not path.is_file():
        raise InputError(f"{path}: scikit-learn's digits.csv.gz not found (make gpu-wheels)")
    sklearn = types.ModuleType("sklearn")
    datasets = types.ModuleType("sklearn.datasets")
    datasets.load_digits = lambda: read_digits(path)  # type: ignore[attr-defined]
    sklearn.datasets = datasets  # type: ignore[attr-defined]
    sys.modules["sklearn"], sys.modules["sklearn.datasets"] = sklearn, datasets


# --- part 3: W1, W2, W3 on the device and on the CPU ---------------------------------------------

RUNNERS = ("vectorized", "sequential", "plain")
# on a GPU, W1 (launch-bound) also with train.compile: reduce-overhead (CUDA graphs of the step)
GPU_RUNNERS = {"W1": ("vectorized-reduce-overhead",)}


def workload_data(wl: backends.Workload, seed: int, test_rows: int) -> FederatedTensors:
    """``backends.start_up``'s federation on synthetic tensors of the workload's shapes: the
    train rows IID over its clients, ``test_rows`` global test rows (10,000: the official test
    set's size; MNIST cannot travel to the GPU)."""
    n = wl.n_train + test_rows
    pool = synthetic_images(wl.dataset, n, wl.shape, 10, seed)
    train = Dataset(wl.dataset, pool.x[: wl.n_train], pool.y[: wl.n_train], 10)
    data = federate(train, PartitionSpec("iid", wl.clients, {}, 0.0, seed))
    test = ClientData(
        torch.from_numpy(pool.x[wl.n_train :].copy()), torch.from_numpy(pool.y[wl.n_train :].copy())
    )
    return dataclasses.replace(data, global_test=test)


def small_workload(wl: backends.Workload) -> backends.Workload:
    """--small: a twentieth of the clients, of at most 60 examples each, 2 a round."""
    clients = max(2, wl.clients // 20)
    per_client = min(SMALL_PER_CLIENT, wl.n_train // wl.clients)
    return dataclasses.replace(wl, clients=clients, per_round=2, n_train=clients * per_client)


def part_backends(
    args: argparse.Namespace, dev: torch.device, deadline: float, res: Result
) -> None:
    devices = [dev] if dev.type == "cpu" else [dev, torch.device("cpu")]
    out = res.data
    out |= {
        "data": "synthetic",
        # by device type, as the runs are keyed ("cuda/vectorized": resolve gives cuda:0)
        "matmul_gflops": {d.type: backends.matmul_gflops(dev=d) for d in devices},
        "workloads": {},
    }
    for name, full in backends.WORKLOADS.items():
        wl = small_workload(full) if args.small else full
        rounds = args.rounds or min(wl.rounds, MAX_WORKLOAD_ROUNDS)
        data = workload_data(wl, args.seed, SMALL_TEST if args.small else TEST_IMAGES)
        node: dict[str, Any] = {"workload": dataclasses.asdict(wl), "rounds": rounds, "runs": {}}
        out["workloads"][name] = node
        for d in devices:
            extra = GPU_RUNNERS.get(name, ()) if d.type == "cuda" else ()
            for runner in (*RUNNERS, *extra):
                key = f"{d.type}/{runner}"
                if time.perf_counter() > deadline:
                    node["runs"][key] = {"status": "skipped", "reason": "the part's time is spent"}
                    continue
                node["runs"][key] = one_backend_run(wl, data, rounds, runner, d, args.seed)
                log.info("  %s %s: %s", name, key, brief(node["runs"][key]))
                res.save()
            seq = node["runs"].get(f"{d.type}/sequential", {}).get("s_per_round")
            vec = node["runs"].get(f"{d.type}/vectorized", {}).get("s_per_round")
            node[f"{d.type}/sequential_over_vectorized"] = seq / vec if seq and vec else None
        probe = seeded_model(args.seed, lambda wl=wl: workload_model(wl))
        node["forward_flops"] = backends.forward_flops(probe, wl.shape)
        node["round_gflop"] = (
            3 * node["forward_flops"] * (wl.n_train // wl.clients) * wl.per_round
            + node["forward_flops"] * data.global_test.num_examples
        ) / 1e9
        for key, run in node["runs"].items():
            if run.get("s_per_round"):
                best = out["matmul_gflops"][key.split("/")[0]]
                run["x_flop_bound"] = run["s_per_round"] / (node["round_gflop"] / best)
        del data
        res.save()


def workload_model(wl: backends.Workload) -> nn.Module:
    return build_model(wl.model, input_shape=wl.shape, num_classes=10, **wl.model_kw)


def one_backend_run(
    wl: backends.Workload,
    data: FederatedTensors,
    rounds: int,
    runner: str,
    dev: torch.device,
    seed: int,
    model_fn: Callable[[], nn.Module] | None = None,
) -> dict[str, Any]:
    """One (workload, runner, device): the library's ``run_library`` or the plain loop."""
    model = seeded_model(seed, model_fn or (lambda: workload_model(wl)))
    peak_reset(dev)
    try:
        if runner == "plain":
            round_s, acc = backends.run_plain(wl, data, model, rounds, seed, dev)
        else:
            backend, _, mode = runner.partition("-")  # vectorized-reduce-overhead: compiled
            round_s, acc = backends.run_library(
                wl, data, model, rounds, seed, backend, "fedavg", dev, compile=mode or "none"
            )
    except Exception as err:
        log.error("    failed: %s", traceback.format_exc())
        return {"status": "error", "error": f"{type(err).__name__}: {err}"}
    return {
        "status": "ok",
        "round_s": round_s,
        "s_per_round": steady(round_s),
        "round1_s": round_s[0],
        "final_accuracy": acc,
        **peak_memory(dev),
    }


def brief(run: Mapping[str, Any]) -> str:
    if run.get("status") not in (None, "ok"):
        return f"{run.get('status')}: {run.get('error') or run.get('reason')}"
    s, peak = run.get("s_per_round"), run.get("peak_device_mib")
    text_ = f"{s:.4f} s/round" if s is not None else "no round"
    text_ += f", {run.get('rounds_done', len(run.get('round_s', [])))} rounds"
    return text_ + (f", peak {peak:.0f} MiB" if peak is not None else "")


# --- part 4: the paper-scale profiles ------------------------------------------------------------


def profile_params(name: str, small: bool) -> Params:
    raw = read_yaml_mapping(REPO / "pipeline" / "reproductions" / f"{name}.yaml", "profile")
    changes = CHECK_OVERRIDES.get(name, {}) | (SMALL_PROFILE[name] if small else {})
    for dotted, value in changes.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    for run, (base, keys) in CHECK_VARIANTS.get(name, {}).items():
        if base in raw["experiment"]["runs"]:
            raw["algorithms"][run] = {**raw["algorithms"][base], **keys}
            raw["experiment"]["runs"] = [*raw["experiment"]["runs"], run]
    return validate_params(raw, f"pipeline/reproductions/{name}.yaml")


def profile_data(params: Params, name: str, small: bool, seed: int) -> tuple[FederatedTensors, str]:
    """The profile's federation on synthetic data of its dataset's shapes; says which."""
    source = params.data.dataset
    ds: str = source.name
    if ds == "image_folder":
        ds = f"image_folder:{getattr(source, 'path', '')}"
    if ds == "ptb":
        seq_len = int(params.data.options().get("seq_len", 35))
        divisor = SMALL_TOKENS_DIVISOR if small else 1
        dataset = synthetic_ptb(seq_len, divisor, seed)
        what = (
            f"synthetic ptb: {sum(PTB_TOKENS) // divisor:,} random tokens, "
            f"{dataset.num_classes:,} words, windows of {seq_len}"
        )
    elif ds in IMAGES:
        n, shape, classes = IMAGES[ds]
        if small:
            n = SMALL_IMAGES[name]
        dataset = synthetic_images(ds.split(":")[-1], n, shape, classes, seed)
        what = f"synthetic {ds}: {n:,} x {'x'.join(map(str, shape))}, {classes} classes"
    else:
        raise InputError(
            f"{name}: data.dataset.name: {ds!r} has no synthetic stand-in here "
            f"(allowed: {[*IMAGES, 'ptb']})"
        )
    return federate(dataset, partition_spec(params)), what


def profile_loop_config(
    params: Params, rounds: int, seed: int, dev: torch.device
) -> loop.LoopConfig:
    """``train`` as the loop sees it (every LoopConfig field ``train`` has), ``rounds`` rounds
    on ``dev``."""
    train = params.train
    shared = {
        f.name: getattr(train, f.name)
        for f in dataclasses.fields(loop.LoopConfig)
        if hasattr(train, f.name)
    }
    return loop.LoopConfig(**(shared | {"rounds": rounds, "seed": seed, "device": str(dev)}))


def part_profiles(
    args: argparse.Namespace, dev: torch.device, deadline: float, res: Result
) -> None:
    out = res.data
    plans = [(name, profile_params(name, args.small)) for name in args.profiles]
    runs_left = sum(len(p.experiment.runs) for _, p in plans)
    for name, params in plans:
        node: dict[str, Any] = {"runs": {}}
        out[name] = node
        t0 = time.perf_counter()
        try:
            data, node["data"] = profile_data(params, name, args.small, args.seed)
        except Exception as err:  # this profile's runs cannot start; the next profile can
            log.error("  %s: its data failed: %s", name, traceback.format_exc())
            node |= {"status": "error", "error": f"{type(err).__name__}: {err}"}
            runs_left -= len(params.experiment.runs)
            continue
        node["data_s"] = time.perf_counter() - t0
        node |= {
            "overrides": CHECK_OVERRIDES.get(name, {})
            | (SMALL_PROFILE[name] if args.small else {}),
            "clients": data.num_clients,
            "clients_per_round": params.train.clients_per_round,
            "eval_every": params.train.eval_every,
            "backend": params.train.backend,
            "model": params.model.name,
        }
        log.info(
            "  %s: %s, %d clients (%.1f s)", name, node["data"], data.num_clients, node["data_s"]
        )
        for run in params.experiment.runs:
            slice_s = (deadline - time.perf_counter()) / max(1, runs_left)
            runs_left -= 1
            if slice_s < MIN_SLICE_S:
                node["runs"][run] = {"status": "skipped", "reason": "the part's time is spent"}
                continue
            node["runs"][run] = profile_run(params, run, data, args, dev, slice_s)
            log.info("  %s %s: %s", name, run, brief(node["runs"][run]))
            res.save()
        del data


def profile_run(
    params: Params,
    run: str,
    data: FederatedTensors,
    args: argparse.Namespace,
    dev: torch.device,
    slice_s: float,
) -> dict[str, Any]:
    acfg = params.algorithm(run)
    rounds = args.rounds or 20
    try:
        model = seeded_model(
            args.seed,
            lambda: build_model(
                params.model.name,
                input_shape=data.input_shape,
                num_classes=data.num_classes,
                **model_options(params.model),
            ),
        )
        algorithm = build_algorithm(acfg)
        if algorithm.validate_model is not None:
            algorithm.validate_model(model)
        comp = acfg.uplink or params.train.compressor
        compressor = build_compressor(comp.name, **comp.model_dump(exclude={"name"}))
        cfg = profile_loop_config(params, rounds, args.seed, dev)
        res = timed_run(cfg, algorithm, model, data, compressor, dev, time.perf_counter() + slice_s)
    except Exception as err:
        log.error("    failed: %s", traceback.format_exc())
        return {"status": "error", "algorithm": acfg.name, "error": f"{type(err).__name__}: {err}"}
    params_n = sum(p.numel() for p in model.parameters())
    full = params.train.rounds + acfg.extra_rounds()  # the profile's whole run
    s = res["s_per_round"]
    # a linear projection of the measured rounds, not a measurement: round 1 (with any warm
    # start) plus the steady median for every other round; a lower bound for ProgFed, whose
    # first rounds train its smallest stage
    projected = res["round1_s"] + (full - 1) * s if s is not None else None
    return {
        "status": "ok",
        "algorithm": acfg.name,
        "parameters": params_n,
        "full_rounds": full,
        "projected_full_run_s": projected,
        **res,
    }


# --- part 5: pfl-research's CIFAR-10 benchmark workload ----------------------------------------

# W3's CIFAR-10 shapes (50,000 train images), pfl's cohorts: 1,000 clients of 50, 50 a round
PFL = dataclasses.replace(
    backends.WORKLOADS["W3"], model="pfl_simple_cnn", clients=1000, per_round=50, batch=10,
    lr=0.1, rounds=20,
)  # fmt: skip


def pfl_simple_cnn(dropout: bool = True, classes: int = 10) -> nn.Module:
    """pfl-research's ``simple_cnn`` (benchmarks/model/pytorch/cnn.py) on 3x32x32: conv 3x3 32,
    conv 3x3 64 (no padding), max-pool 2, dropout 0.25, fc 12544 -> 128, dropout 0.5, fc 128 ->
    classes, ReLUs; Glorot-uniform weights, as pfl initialises it (1,626,442 parameters)."""
    drop: Callable[[float], nn.Module] = nn.Dropout if dropout else (lambda _p: nn.Identity())
    model = nn.Sequential(
        nn.Conv2d(3, 32, kernel_size=3),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        drop(0.25),
        nn.Flatten(),
        nn.Linear(14 * 14 * 64, 128),
        nn.ReLU(),
        drop(0.5),
        nn.Linear(128, classes),
    )
    for m in model.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            nn.init.xavier_uniform_(m.weight)
    return model


def part_pfl(args: argparse.Namespace, dev: torch.device, deadline: float, res: Result) -> None:
    wl = small_workload(PFL) if args.small else PFL
    rounds = args.rounds or wl.rounds
    data = workload_data(wl, args.seed, SMALL_TEST if args.small else TEST_IMAGES)
    local = LocalConfig(epochs=1, batch_size=wl.batch, lr=wl.lr)
    reason = library_backends.model_unbatched_reason(pfl_simple_cnn().to(dev), data.to(dev), local)
    out = res.data
    out |= {
        "workload": dataclasses.asdict(wl),
        "rounds": rounds,
        "data": "synthetic cifar10 shapes",
        "model": "pfl-research simple_cnn",
        "parameters": sum(p.numel() for p in pfl_simple_cnn().parameters()),
        "vectorized_fallback": reason,
        "runs": {},
    }
    variants = [(r, True) for r in RUNNERS] + [("vectorized", False)]
    for runner, dropout in variants:
        key = runner if dropout else f"{runner}-no-dropout"
        if time.perf_counter() > deadline:
            out["runs"][key] = {"status": "skipped", "reason": "the part's time is spent"}
            continue
        out["runs"][key] = one_backend_run(
            wl, data, rounds, runner, dev, args.seed, lambda d=dropout: pfl_simple_cnn(d)
        )
        log.info("  pfl %s: %s", key, brief(out["runs"][key]))
        res.save()


# --- part 6: one simulation on 1 and 2 processes ---------------------------------------------


def part_shard(args: argparse.Namespace, dev: torch.device, deadline: float, res: Result) -> None:
    """``benchmarks/sharding.py`` in a subprocess (it starts its own processes), on ``dev``."""
    out = res.data
    workloads = ["W1"] if args.small else ["W1", "W3"]
    rounds = args.rounds or 5
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sharding.json"
        cmd = [sys.executable, str(REPO / "benchmarks" / "sharding.py"), "--synthetic",
               "--device", str(dev), "--workloads", *workloads, "--rounds", str(rounds),
               "--nproc", "2", "--json", str(path)]  # fmt: skip
        out |= {"command": " ".join(cmd[1:]), "rounds": rounds}
        try:
            proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                                  timeout=max(1.0, deadline - time.perf_counter()))  # fmt: skip
        except subprocess.TimeoutExpired:
            raise RuntimeError("the sharding benchmark ran out of the part's time") from None
        if proc.returncode != 0:
            raise RuntimeError(f"the sharding benchmark failed: {proc.stderr[-1500:]}")
        out |= json.loads(path.read_text())
    for name, runs in out["workloads"].items():
        one, two = runs["1"], runs["2"]
        log.info("  shard %s: 1 process %.4f s/round, 2: %.4f (%s)", name,
                 one["s_per_round"], two["s_per_round"], two["final_model"])  # fmt: skip


# --- the driver ---------------------------------------------------------------------------------

PART_FNS: dict[str, Callable[[argparse.Namespace, torch.device, float, Result], None]] = {
    "env": part_env,
    "contract": part_contract,
    "backends": part_backends,
    "profiles": part_profiles,
    "pfl": part_pfl,
    "shard": part_shard,
}


def run_parts(args: argparse.Namespace, dev: torch.device, report: Report) -> bool:
    """Every part in turn, each in its time slice; True when none failed."""
    budget = Budget(args.budget_s)
    ok = True
    for part in args.parts:
        node = report.part(part)
        slice_s = budget.part_slice(part, args.parts) if SHARES[part] else budget.left()
        if part != "env" and slice_s < MIN_SLICE_S:
            node |= {"status": "skipped", "reason": f"budget spent ({budget.left():.0f} s left)"}
            log.info("part %s: skipped (budget spent)", part)
            report.save()
            continue
        log.info("part %s: %.0f s of %.0f s left", part, slice_s, budget.left())
        report.save()
        t0, cpu0 = time.perf_counter(), time.process_time()
        try:
            node["result"] = {}
            PART_FNS[part](args, dev, t0 + slice_s, Result(node["result"], report.save))
            node["status"] = "ok"
        except PartFailed as err:
            node |= {"status": "error", "error": str(err)}
            node["result"].update(err.result)
            ok = False
        except Terminated as err:  # what the finished parts and runs measured is on disk
            node |= {"status": "error", "error": f"stopped by {err} (the launcher's timeout)"}
            node["seconds"] = time.perf_counter() - t0
            report.save()
            raise
        except Exception as err:  # recorded; the next part runs
            log.error("part %s failed: %s", part, traceback.format_exc())
            node |= {
                "status": "error",
                "error": f"{type(err).__name__}: {err}",
                "traceback": traceback.format_exc()[-4000:],
            }
            ok = False
        node["seconds"] = time.perf_counter() - t0
        node["cpu_s"] = time.process_time() - cpu0  # this process's CPU time (all threads)
        node["slice_s"] = slice_s
        if node["status"] == "ok" and any_error(node["result"]):
            node["status"] = "error"
            node["error"] = "some runs failed (see their status)"
            ok = False
        log.info("part %s: %s in %.1f s", part, node["status"], node["seconds"])
        report.data["elapsed_s"] = time.perf_counter() - budget.start
        report.save()
    return ok


def any_error(node: Any) -> bool:
    if isinstance(node, dict):
        return node.get("status") == "error" or any(any_error(v) for v in node.values())
    return False


def default_out() -> Path:
    out = os.environ.get("OUT")
    return Path(out) if out else REPO / "benchmarks" / "results"


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    p.add_argument(
        "--budget-s",
        type=float,
        default=420.0,
        help="the whole check's time budget in seconds (default 420)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds of every run (default: W1 20, W2 5, W3 3, profiles 20, pfl 20)",
    )
    p.add_argument(
        "--small",
        action="store_true",
        help="smaller datasets and cohorts, same models (a CPU dry run)",
    )
    p.add_argument("--dry-run", action="store_true", help="--device cpu --rounds 1 --small")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--profiles", nargs="+", default=list(PROFILES), choices=PROFILES)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder of gpu_check.json and gpu_check.log (default $OUT, else "
        "benchmarks/results/ with the date and device in the names)",
    )
    p.add_argument("--contract-worker", metavar="OUTCOMES", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.dry_run:
        args.device, args.rounds, args.small = "cpu", 1, True
    if args.rounds is not None and args.rounds < 1:
        p.error(f"--rounds: must be >= 1 (got {args.rounds})")
    args.parts = [part for part in PARTS if part in args.parts]  # always in the order above
    return args


def _shown(path: Path) -> str:
    """``path`` as a log may show it: under ``$OUT`` or the working directory, never the
    machine's absolute path (the logs are committed under benchmarks/results/)."""
    for root, name in ((os.environ.get("OUT"), "$OUT"), (os.getcwd(), ".")):
        if root and path.resolve().is_relative_to(Path(root).resolve()):
            return f"{name}/{path.resolve().relative_to(Path(root).resolve())}"
    return path.name


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.contract_worker:
        return contract_worker(args.contract_worker)
    try:
        dev = device.resolve(args.device)
    except InputError as err:
        print(f"gpu_check: --device: {err} (a CPU dry run: --dry-run)", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    out = args.out or default_out()
    out.mkdir(parents=True, exist_ok=True)
    stem = "gpu_check"
    if args.out is None and not os.environ.get("OUT"):
        stem = f"{datetime.date.today().isoformat()}_gpu_check_{dev.type}"
    header = {
        "schema": 1,
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": sys.argv[1:] if argv is None else argv,
        "args": {k: v for k, v in vars(args).items() if k != "contract_worker"} | {"out": None},
        "budget_s": args.budget_s,
    }
    with logging_to(out / f"{stem}.log"):
        report = Report(out / f"{stem}.json", header)
        log.info(
            "gpu_check on %s, budget %.0f s, parts %s -> %s",
            dev,
            args.budget_s,
            args.parts,
            _shown(report.path),
        )
        signal.signal(signal.SIGTERM, _terminate)
        try:
            ok = run_parts(args, dev, report)
        except Terminated:
            log.error("stopped by SIGTERM: the JSON holds every part that ended")
            return 124
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        report.data["finished"] = True
        report.save()
        log.info("done: %s", "every part ok" if ok else "some parts failed (see the JSON)")
    return 0 if ok else 1


@contextlib.contextmanager
def logging_to(path: Path) -> Iterator[None]:
    """This script's and the library's log lines (a backend's fallback, chunk sizes) to ``path``
    and stderr, for the duration (the process's other logging is left as it was)."""
    handlers: list[logging.Handler] = [logging.FileHandler(path, mode="w"), logging.StreamHandler()]
    for h in handlers:
        h.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    loggers = [log, logging.getLogger("fedcomm")]
    saved = [(lg.level, lg.propagate) for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.INFO)
        lg.propagate = False
        for h in handlers:
            lg.addHandler(h)
    try:
        yield
    finally:
        for lg, (level, propagate) in zip(loggers, saved, strict=True):
            for h in handlers:
                lg.removeHandler(h)
            lg.setLevel(level)
            lg.propagate = propagate
        for h in handlers:
            h.close()


if __name__ == "__main__":
    sys.exit(main())
