"""pfl-research's CIFAR-10 benchmark workload in pfl and in fedcomm, side by side, on this CPU.

The workload is pfl-research's ``benchmarks/image_classification/configs/baseline.yaml`` (see
``PFL`` in ``benchmarks/gpu_check.py``): ``cifar10_iid``, 1,000 clients of 50 images, 50 a round,
local batch 10, 1 local epoch, local SGD lr 0.1, FedAvg with a central plain SGD of lr 1.0, the
``simple_cnn`` (conv 3x3 32, conv 3x3 64, max-pool 2, dropout 0.25, fc 128, dropout 0.5, fc 10;
Glorot-uniform; 1,626,442 parameters), the global model evaluated on the test set. This script
runs it at a reduced scale (the flags below; ``--paper-cohort`` restores 50 clients a round and
the 10,000 test images) three times, each in a process of its own:

- ``fedcomm-vectorized`` / ``fedcomm-sequential``: ``fedcomm.simulation.loop.run`` with FedAvg's
  defaults (server SGD lr 1) on that backend, in this venv; the result records the backend that
  actually ran the clients (``backend_ran``: the CNN's dropout trains batched since issue 44);
- ``pfl``: pfl 0.6.0's PyTorch simulation as pfl-research's ``image_classification/pytorch/
  train.py`` builds it (``PyTorchModel`` with ``torch.optim.SGD`` locally and centrally,
  ``SimulatedBackend`` with ``WeightByUser``, ``FederatedAveraging`` with ``NNAlgorithmParams``,
  ``NNTrainHyperParams``, ``CentralEvaluationCallback`` with ``NNEvalHyperParams``), its model
  pfl-research's own ``simple_cnn`` (channels-last input, a ``Transpose2D`` first, as there), in
  the separate venv ``--pfl-python`` (pfl never goes into fedcomm's environment).

Both sides get the same data (one set of files in a temporary folder: the same clients, rows,
test images; each split in a seeded random order, as pfl-research permutes it, and standardized
per channel with the train rows' statistics as its ``load_and_preprocess`` does), the same
initial weights (``gpu_check.seeded_model`` of ``gpu_check.pfl_simple_cnn``, copied into pfl's
model; the JSON holds both sides' digests), the same cohorts (``--pfl-sampler fedcomm``, the
default: pfl's user sampler replays fedcomm's ``loop.sample_cohort``; ``random`` is
pfl-research's own, uniform with replacement), the same intra-op threads (``--threads``) and the
global evaluation every round on the same test images with the same batch (``--eval-batch``).
Data: CIFAR-10's JPEG copy under the data root (``cifar10_jpeg``, fedcomm's ``image_folder``
loader) when there, else random tensors of its shapes (``--data synthetic``; the accuracy is then
chance).

Reported: each side's wall seconds per round (median over rounds 2.. of every repeat: round 1
pays the start-up), the same less each round's global evaluation (timed inside each library:
fedcomm's ``evaluate_global``, pfl's ``CentralEvaluationCallback``), round 1 apart, the global
accuracy after every round, peak RSS, the ratios fedcomm / pfl (> 1: fedcomm is slower), the
machine, and each side's torch (and pfl's numpy) version.

What is not the same (recorded in the JSON's ``differences``): pfl batches each client's rows in
their stored order, fedcomm shuffles them each epoch; pfl evaluates the central test set before
round 1 and not after it (fedcomm after every round; round 1 is outside the median); pfl-research
evaluates every user's data before and after local training every ``evaluation_frequency`` (10)
rounds, which this script turns off after pfl's first round (fedcomm's clients have no local test
rows here).

The pfl venv (once, in the repository root; ``.venv-pfl/`` is ignored by git): pfl 0.6.0 and
its dependencies install beside torch 2.13.0's CPU build, installed first as the Makefile
installs it for ``.venv``; ``pip check`` finds no conflict (numpy 2.4.6, scipy 1.17.1):

    python3.11 -m venv .venv-pfl
    .venv-pfl/bin/python -m pip install --upgrade pip
    .venv-pfl/bin/python -m pip install torch==2.13.0
    .venv-pfl/bin/python -m pip install pfl==0.6.0
    .venv-pfl/bin/python -m compileall -q -j 0 .venv-pfl/lib   # optional: a faster start-up

Then, from the repository root:

    .venv/bin/python benchmarks/pfl_side_by_side.py \
        --json benchmarks/results/DATE_pfl_side_by_side_cpu.json
        [--rounds 5] [--clients-per-round 10] [--test-images 2000] [--threads 1] [--repeats 1]
        [--clients 1000] [--per-client 50] [--paper-cohort] [--eval-batch 10000]
        [--data auto|cifar10_jpeg|synthetic] [--data-root DIR] [--pfl-sampler fedcomm|random]
        [--sides fedcomm-vectorized fedcomm-sequential pfl] [--pfl-python .venv-pfl/bin/python]

Measured (2 cores, the nice-10 training jobs paused): benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
SIDES = ("fedcomm-vectorized", "fedcomm-sequential", "pfl")
CIFAR10_TRAIN, CIFAR10_TEST = 50_000, 10_000
SHAPE = (3, 32, 32)
CENTRAL_ACCURACY = "Central val | accuracy"  # pfl's CentralEvaluationCallback's name
CLASSES = 10
# pfl-research's baseline.yaml (cifar10_iid): 1,000 users of 50, 50 a round, B = 10, E = 1
PAPER = {"clients": 1000, "per_client": 50, "per_round": 50, "test": 10_000, "rounds": 1500}
REDUCED = {"per_round": 10, "test": 2_000, "rounds": 5}


# --- shared by every process -------------------------------------------------------------------


def steady(round_s: list[float]) -> float | None:
    """Median s/round over rounds 2.. (round 1 pays the warm-up), round 1 if it is the only."""
    rest = round_s[1:] or round_s
    return statistics.median(rest) if rest else None


def without_eval(round_s: list[float], eval_s: list[float]) -> list[float]:
    """Rounds 2.. less each one's global evaluation (``eval_s``: the evaluations after rounds
    2..)."""
    return [r - e for r, e in zip(round_s[1:], eval_s, strict=True)]


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def digest(params: Iterator[torch.Tensor]) -> str:
    """sha256 of the parameters' float32 bytes, in order."""
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def set_threads(n: int) -> None:
    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # (once per process, before any parallel work)
        torch.set_num_interop_threads(1)


def peak_rss_mib() -> float | None:
    """This process's peak RSS since it started (``VmHWM``: ``getrusage``'s ``ru_maxrss``
    would carry the driver's over the fork)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


# --- the driver (fedcomm's venv) ----------------------------------------------------------------


def _gpu_check() -> types.ModuleType:
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_check.py, beside this file
    import gpu_check

    return gpu_check


Arrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def load_pool(args: argparse.Namespace) -> tuple[Arrays, str]:
    """CIFAR-10's train and test images (n, 3, 32, 32) in [0, 1] with their labels, and where
    they came from: the JPEG copy under the data root, else (``auto``) random tensors."""
    from fedcomm.data.datasets.registry import load_dataset
    from fedcomm.data.datasets.verify import DatasetNotFoundError

    if args.data in ("auto", "cifar10_jpeg"):
        try:
            pool = load_dataset("image_folder", args.data_root, path="cifar10_jpeg")
        except DatasetNotFoundError:
            if args.data == "cifar10_jpeg":
                raise
        else:
            if len(pool.x) != CIFAR10_TRAIN + CIFAR10_TEST:
                raise SystemExit(f"cifar10_jpeg: {len(pool.x)} images, not 60,000")
            x, y = pool.x, np.asarray(pool.y, dtype=np.int64)
            n = CIFAR10_TRAIN
            return (x[:n], y[:n], x[n:], y[n:]), "cifar10_jpeg"
    g = np.random.default_rng(args.seed)  # the speed is the same, the accuracy chance
    x = g.random((CIFAR10_TRAIN + CIFAR10_TEST, *SHAPE), dtype=np.float32)
    y = g.permutation(np.arange(len(x), dtype=np.int64) % CLASSES)
    n = CIFAR10_TRAIN
    return (x[:n], y[:n], x[n:], y[n:]), "synthetic"


def prepare(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The data, the partition, the cohorts and the initial weights, written into ``folder``
    for every side; what was written."""
    from fedcomm.data.federated import PartitionSpec, make_partition
    from fedcomm.data.types import Dataset
    from fedcomm.simulation import loop

    gpu_check = _gpu_check()
    t0 = time.perf_counter()
    (x_train, y_train, x_test, y_test), source = load_pool(args)
    g = np.random.default_rng(args.seed)
    n_train = args.clients * args.per_client
    if n_train > len(x_train):
        raise SystemExit(f"{args.clients} x {args.per_client} images > {len(x_train)}")
    if args.test_images > len(x_test):
        raise SystemExit(f"--test-images {args.test_images} > {len(x_test)}")
    # each split in a seeded random order, as pfl-research's make_iid_federated_dataset
    # permutes it (the folders are in class order, and a client's rows keep the pool's order:
    # pfl trains them in that order), then its per-channel standardization with the
    # statistics of the train rows used
    rows = g.permutation(len(x_train))[:n_train]
    test_rows = g.permutation(len(x_test))[: args.test_images]
    x_train, y_train = x_train[rows], y_train[rows]
    x_test, y_test = x_test[test_rows], y_test[test_rows]
    mean = x_train.mean(axis=(0, 2, 3), dtype=np.float64).reshape(1, -1, 1, 1)
    std = x_train.std(axis=(0, 2, 3), dtype=np.float64).reshape(1, -1, 1, 1)
    x_train = ((x_train - mean) / std).astype(np.float32)
    x_test = ((x_test - mean) / std).astype(np.float32)
    # fedcomm's IID partition (what gpu_check.workload_data does): every client per_client rows
    part = make_partition(
        Dataset("cifar10", x_train, y_train, CLASSES),
        PartitionSpec("iid", args.clients, {}, 0.0, args.seed),
    )
    sizes = [len(r) for r in part.train]
    cohorts = np.array(
        [
            loop.sample_cohort(args.seed, r, args.clients, args.per_round)
            for r in range(1, args.rounds + 1)
        ],
        dtype=np.int64,
    )
    for name, arr in {
        "x_train": x_train,
        "y_train": y_train,
        "x_test": x_test,
        "y_test": y_test,
        "client_rows": np.concatenate(part.train).astype(np.int64),
        "client_sizes": np.array(sizes, dtype=np.int64),
        "cohorts": cohorts,
    }.items():
        np.save(folder / f"{name}.npy", arr)
    model = gpu_check.seeded_model(args.seed, gpu_check.pfl_simple_cnn)
    torch.save([p.detach().clone() for p in model.parameters()], folder / "init.pt")
    return {
        "source": source,
        "train_images": n_train,
        "test_images": len(x_test),
        "client_sizes": sorted(set(sizes)),
        "channel_mean": mean.ravel().tolist(),
        "channel_std": std.ravel().tolist(),
        "init_digest": digest(model.parameters()),
        "parameters": sum(p.numel() for p in model.parameters()),
        "prepare_s": time.perf_counter() - t0,
    }


def run_side(args: argparse.Namespace, side: str, folder: Path) -> dict[str, Any]:
    """One side in a process of its own (the pfl side in the pfl venv)."""
    python = args.pfl_python if side == "pfl" else sys.executable
    out = folder / f"{side}.json"
    cmd = [str(python), str(Path(__file__).resolve()), "--worker", side, "--dir", str(folder)]
    cmd += ["--threads", str(args.threads), "--seed", str(args.seed)]
    cmd += ["--rounds", str(args.rounds), "--batch", str(args.batch), "--lr", str(args.lr)]
    cmd += ["--eval-batch", str(args.eval_batch), "--pfl-sampler", args.pfl_sampler]
    threads = str(args.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stdout + proc.stderr)[-3000:]
        print(tail, file=sys.stderr)
        return {"status": "error", "returncode": proc.returncode, "log_tail": tail}
    result: dict[str, Any] = json.loads(out.read_text())
    return {"status": "ok", **result, "process_wall_s": wall}


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def machine() -> dict[str, Any]:
    model_name = None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model_name = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": model_name,
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "loadavg_at_start": os.getloadavg(),
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's repeats: the medians over every repeat's rounds 2.., the first repeat's
    accuracies and backend (every repeat starts from the same state)."""
    ok = [r for r in runs if r["status"] == "ok"]
    first = ok[0] if ok else {}
    return {
        "status": "ok" if len(ok) == len(runs) else "error",
        "s_per_round": median([s for r in ok for s in r["round_s"][1:]]),
        "s_per_round_without_eval": median([s for r in ok for s in r["rounds_without_eval"]]),
        "round1_s": median([r["round_s"][0] for r in ok]),
        "eval_s": median([s for r in ok for s in r["eval_s"]]),
        "global_accuracy": first.get("global_accuracy"),
        "backend_ran": first.get("backend_ran"),
        "repeats": runs,
    }


def driver(args: argparse.Namespace) -> int:
    config = {
        "clients": args.clients,
        "per_client": args.per_client,
        "clients_per_round": args.per_round,
        "rounds": args.rounds,
        "test_images": args.test_images,
        "local_batch": args.batch,
        "local_epochs": 1,
        "local_lr": args.lr,
        "server": "FedAvg, central SGD lr 1.0 (no momentum)",
        "eval_batch": args.eval_batch,
        "eval_every": 1,
        "threads": args.threads,
        "repeats": args.repeats,
        "seed": args.seed,
        "pfl_sampler": args.pfl_sampler,
        "paper_scale": {k: PAPER[k] for k in ("clients", "per_client", "per_round", "test")},
    }
    report: dict[str, Any] = {
        "benchmark": "pfl_side_by_side",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "machine": machine(),
        "config": config,
        "differences": [
            "pfl iterates each client's rows in their stored order in every epoch; fedcomm "
            "shuffles them each epoch (so the two sides' models differ after round 1)",
            "pfl evaluates the central test set before round 1 and after rounds 2..; fedcomm "
            "after every round (round 1 is outside the median)",
            "pfl-research also evaluates each user's data before and after local training every "
            "10 rounds; here only in pfl's round 1 (pfl evaluates them in its iteration 0)",
            "pfl's model takes channels-last images and transposes them (pfl-research's "
            "Transpose2D); fedcomm's takes (N, C, H, W)",
        ],
    }
    with tempfile.TemporaryDirectory(prefix="pfl_side_by_side_") as tmp:
        folder = Path(tmp)
        print(f"preparing the data ({args.data}) ...", flush=True)
        report["data"] = prepare(args, folder)
        print(f"  {report['data']['source']}: {report['data']['prepare_s']:.1f} s", flush=True)
        repeats: dict[str, list[dict[str, Any]]] = {side: [] for side in args.sides}
        for k in range(args.repeats):  # interleaved: a noisy spell of a shared host hits all
            for side in args.sides:
                print(f"{side} (repeat {k + 1} of {args.repeats}) ...", flush=True)
                run = run_side(args, side, folder)
                repeats[side].append(run)
                if run["status"] == "ok":
                    acc = run["global_accuracy"][-1] if run["global_accuracy"] else None
                    print(
                        f"  {run['s_per_round']:.3f} s/round, "
                        f"{run['s_per_round_without_eval']:.3f} without the evaluation "
                        f"(round 1 {run['round_s'][0]:.2f} s), accuracy {acc}, "
                        f"backend {run.get('backend_ran', 'pfl')}",
                        flush=True,
                    )
    report["runs"] = {side: summarize(runs) for side, runs in repeats.items()}
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    report["ratios"] = {}
    pfl_run = report["runs"].get("pfl", {})
    for key, suffix in (("s_per_round", ""), ("s_per_round_without_eval", "_without_eval")):
        for side, run in report["runs"].items():
            mine, theirs = run.get(key), pfl_run.get(key)
            if side != "pfl":
                ratio = mine / theirs if mine and theirs else None
                report["ratios"][f"{side}_over_pfl{suffix}"] = ratio
    for key, value in report["ratios"].items():
        print(f"{key}: {value:.3f}" if value is not None else f"{key}: n/a")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {os.path.relpath(args.json, Path.cwd())}")
    return 0 if all(r["status"] == "ok" for r in report["runs"].values()) else 1


# --- the fedcomm side ----------------------------------------------------------------------------


def fedcomm_worker(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    from fedcomm.algorithms import build_algorithm
    from fedcomm.algorithms.core import ClientData
    from fedcomm.algorithms.core.local import LocalConfig
    from fedcomm.algorithms.fedavg import Config as FedAvgConfig
    from fedcomm.comm.codecs import build_compressor
    from fedcomm.data.types import Dataset
    from fedcomm.simulation import loop
    from fedcomm.simulation.data import FederatedTensors
    from fedcomm.simulation.global_eval import evaluate_global

    gpu_check = _gpu_check()
    folder = args.dir
    x_train, y_train = np.load(folder / "x_train.npy"), np.load(folder / "y_train.npy")
    sizes = np.load(folder / "client_sizes.npy")
    rows = np.split(np.load(folder / "client_rows.npy"), np.cumsum(sizes)[:-1])
    data = FederatedTensors.build(
        Dataset("cifar10", x_train, y_train, CLASSES), rows, [np.zeros(0, np.int64)] * len(rows)
    )
    test = ClientData(
        torch.from_numpy(np.load(folder / "x_test.npy")),
        torch.from_numpy(np.load(folder / "y_test.npy")),
    )
    data = FederatedTensors(
        data.train, data.test, test, data.num_classes, data.input_shape, data.union_rows
    )
    del x_train, y_train
    cohorts = np.load(folder / "cohorts.npy")
    model = gpu_check.pfl_simple_cnn()
    with torch.no_grad():
        for p, v in zip(model.parameters(), torch.load(folder / "init.pt"), strict=True):
            p.copy_(v)
    init = digest(model.parameters())
    rounds = args.rounds
    local = LocalConfig(epochs=1, batch_size=args.batch, lr=args.lr)
    cfg = loop.LoopConfig(
        rounds,
        int(cohorts.shape[1]),
        local,
        args.seed,
        eval_every=1,
        eval_batch_size=args.eval_batch,
        backend=backend,
        device="cpu",
    )
    for r in range(1, rounds + 1):  # the cohorts the pfl side replays are the loop's own
        assert loop.sample_cohort(args.seed, r, data.num_clients, cfg.clients_per_round) == list(
            cohorts[r - 1]
        )
    config = FedAvgConfig().with_rounds(rounds)  # server SGD lr 1: model averaging
    algorithm, compressor = build_algorithm(config), build_compressor("none")
    stamps: list[float] = []
    accuracy: list[float | None] = []
    eval_s: list[float] = []

    def timed_eval(*a: Any, **kw: Any) -> Any:  # the loop's global evaluation, timed
        t = time.perf_counter()
        out = evaluate_global(*a, **kw)
        eval_s.append(time.perf_counter() - t)
        return out

    def tick(r: int, m: Any) -> None:
        stamps.append(time.perf_counter())
        accuracy.append(m.get("global/accuracy"))

    loop.evaluate_global = timed_eval  # type: ignore[attr-defined]
    t0 = time.perf_counter()
    result = loop.run(cfg, algorithm, model, data, compressor, config_hash="pfl", progress=tick)
    round_s = [b - a for a, b in zip([t0, *stamps[:-1]], stamps, strict=True)]
    return {
        "side": f"fedcomm-{backend}",
        "backend": backend,
        "backend_ran": result.backend,
        "algorithm": config.name,
        "server": str(config.server),
        "round_s": round_s,
        "s_per_round": steady(round_s),
        "eval_s": eval_s,
        "rounds_without_eval": without_eval(round_s, eval_s[1:]),
        "s_per_round_without_eval": median(without_eval(round_s, eval_s[1:])),
        "global_accuracy": accuracy,
        "init_digest": init,
        "parameters": sum(p.numel() for p in model.parameters()),
        "threads": torch.get_num_threads(),
        "peak_rss_mib": peak_rss_mib(),
        "torch": torch.__version__,
    }


# --- the pfl side (pfl's venv: imports neither fedcomm nor the other benchmarks) ---------------


def pfl_simple_cnn() -> nn.Module:
    """pfl-research's ``benchmarks/model/pytorch/cnn.py:simple_cnn((32, 32, 3), 10)``: its
    ``Transpose2D`` first (channels-last input), Glorot-uniform weights, ``loss`` and
    ``metrics`` as its ``image_classification_loss`` / ``image_classification_metrics``."""
    from pfl.metrics import Weighted

    class Transpose2D(nn.Module):
        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return inputs.permute((0, 3, 1, 2))

    model = nn.Sequential(
        Transpose2D(),
        nn.Conv2d(3, 32, kernel_size=(3, 3)),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=(3, 3)),
        nn.ReLU(),
        nn.MaxPool2d((2, 2)),
        nn.Dropout(0.25),
        nn.Flatten(),
        nn.Linear(14 * 14 * 64, 128),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Linear(128, CLASSES),
    )
    for m in model.modules():
        if isinstance(m, nn.Conv2d | nn.Linear):
            nn.init.xavier_uniform_(m.weight)

    def loss(
        self: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, eval: bool = False
    ) -> torch.Tensor:
        self.eval() if eval else self.train()
        return nn.functional.cross_entropy(self(inputs), targets.long(), reduction="mean")

    @torch.no_grad()
    def metrics(
        self: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, eval: bool = True
    ) -> dict[str, Any]:
        self.eval() if eval else self.train()
        logits = self(inputs)
        n = len(inputs)
        correct = (logits.argmax(-1) == targets.long()).float().sum().item()
        total = nn.functional.cross_entropy(logits, targets.long(), reduction="sum").item()
        return {"loss": Weighted(total, n), "accuracy": Weighted(correct, n)}

    model.loss = types.MethodType(loss, model)  # type: ignore[assignment]
    model.metrics = types.MethodType(metrics, model)  # type: ignore[assignment]
    return model


def pfl_worker(args: argparse.Namespace) -> dict[str, Any]:
    import pfl
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.aggregate.weighting import WeightByUser
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.model.pytorch import PyTorchModel

    torch.random.manual_seed(args.seed)  # as pfl-research's train.py seeds torch and numpy
    np.random.seed(args.seed)
    folder = args.dir
    # channels-last, as pfl-research's CIFAR-10 pickles are
    x_train = torch.from_numpy(np.load(folder / "x_train.npy").transpose(0, 2, 3, 1).copy())
    y_train = torch.from_numpy(np.load(folder / "y_train.npy"))
    x_test = torch.from_numpy(np.load(folder / "x_test.npy").transpose(0, 2, 3, 1).copy())
    y_test = torch.from_numpy(np.load(folder / "y_test.npy"))
    sizes = np.load(folder / "client_sizes.npy")
    rows = [
        torch.from_numpy(r)
        for r in np.split(np.load(folder / "client_rows.npy"), np.cumsum(sizes)[:-1])
    ]
    users = {u: (x_train[r], y_train[r]) for u, r in enumerate(rows)}
    del x_train, y_train
    cohorts = np.load(folder / "cohorts.npy")
    rounds, per_round = int(cohorts.shape[0]), int(cohorts.shape[1])
    if args.pfl_sampler == "fedcomm":  # fedcomm's cohorts, client after client
        replay = iter(cohorts.ravel().tolist())
        sampler: Callable[[], int] = lambda: next(replay)  # noqa: E731
    else:  # pfl-research's: uniform, with replacement
        sampler = get_user_sampler("random", range(len(users)))
    train_data = FederatedDataset.from_slices(users, sampler)
    central = Dataset(raw_data=[x_test, y_test])

    net = pfl_simple_cnn()
    with torch.no_grad():
        for p, v in zip(net.parameters(), torch.load(folder / "init.pt"), strict=True):
            p.copy_(v)
    init = digest(net.parameters())
    params = [p for p in net.parameters() if p.requires_grad]
    model = PyTorchModel(
        model=net,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(params, 1.0),
    )
    backend = SimulatedBackend(
        training_data=train_data, val_data=train_data, postprocessors=[WeightByUser()]
    )
    algorithm_params = NNAlgorithmParams(
        central_num_iterations=rounds,
        evaluation_frequency=rounds + 1,  # users' own evaluation: pfl's first round only
        train_cohort_size=per_round,
        val_cohort_size=0,
    )
    train_params = NNTrainHyperParams(
        local_learning_rate=args.lr, local_num_epochs=1, local_batch_size=args.batch
    )
    eval_params = NNEvalHyperParams(local_batch_size=args.eval_batch)
    stamps: list[float] = []
    accuracy: list[float | None] = []

    class Stopwatch(TrainingProcessCallback):  # type: ignore[misc]
        """After every other callback of a round (the central evaluation included)."""

        def on_train_begin(self, *, model: Any) -> Any:
            stamps.append(time.perf_counter())
            return pfl.metrics.Metrics()

        def after_central_iteration(
            self, aggregate_metrics: Any, model: Any, *, central_iteration: int
        ) -> Any:
            stamps.append(time.perf_counter())
            acc = None
            if central_iteration > 0 and CENTRAL_ACCURACY in aggregate_metrics:
                # (iteration 0's metrics hold the evaluation before round 1 instead)
                acc = float(pfl.metrics.get_overall_value(aggregate_metrics[CENTRAL_ACCURACY]))
            accuracy.append(acc)
            return False, pfl.metrics.Metrics()

    eval_s: list[float] = []

    class TimedCentralEvaluation(CentralEvaluationCallback):  # type: ignore[misc]
        """pfl's central evaluation, its evaluations after rounds 2.. timed."""

        def after_central_iteration(
            self, aggregate_metrics: Any, model: Any, *, central_iteration: int
        ) -> Any:
            t = time.perf_counter()
            out = super().after_central_iteration(
                aggregate_metrics, model, central_iteration=central_iteration
            )
            if central_iteration > 0:
                eval_s.append(time.perf_counter() - t)
            return out

    callbacks = [
        TimedCentralEvaluation(central, model_eval_params=eval_params, frequency=1),
        Stopwatch(),
    ]
    FederatedAveraging().run(
        algorithm_params=algorithm_params,
        backend=backend,
        model=model,
        model_train_params=train_params,
        model_eval_params=eval_params,
        callbacks=callbacks,
    )
    round_s = [b - a for a, b in itertools.pairwise(stamps)]
    return {
        "side": "pfl",
        "pfl": pfl.__version__,
        "sampler": args.pfl_sampler,
        "round_s": round_s,
        "s_per_round": steady(round_s),
        "eval_s": eval_s,
        "rounds_without_eval": without_eval(round_s, eval_s),
        "s_per_round_without_eval": median(without_eval(round_s, eval_s)),
        "global_accuracy": accuracy,
        "init_digest": init,
        "parameters": sum(p.numel() for p in net.parameters()),
        "threads": torch.get_num_threads(),
        "peak_rss_mib": peak_rss_mib(),
        "torch": torch.__version__,
        "numpy": np.__version__,
    }


# --- the command line ----------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=REDUCED["rounds"], help="(paper: 1,500)")
    p.add_argument(
        "--clients-per-round", dest="per_round", type=int, default=None, help="10 (paper: 50)"
    )
    p.add_argument("--test-images", type=int, default=None, help="2,000 (paper: 10,000)")
    p.add_argument(
        "--paper-cohort",
        action="store_true",
        help="50 clients a round and the 10,000 test images (pfl-research's baseline.yaml)",
    )
    p.add_argument("--clients", type=int, default=PAPER["clients"])
    p.add_argument("--per-client", type=int, default=PAPER["per_client"])
    p.add_argument("--batch", type=int, default=10, help="local batch")
    p.add_argument("--lr", type=float, default=0.1, help="local SGD learning rate")
    p.add_argument(
        "--eval-batch",
        type=int,
        default=10_000,
        help="central evaluation batch (pfl-research: central_eval_batch_size 10000)",
    )
    p.add_argument("--threads", type=int, default=1, help="intra-op threads on every side")
    p.add_argument("--repeats", type=int, default=1, help="processes per side, interleaved")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", choices=["auto", "cifar10_jpeg", "synthetic"], default="auto")
    from_env = os.environ.get("FEDCOMM_DATA_ROOT")
    p.add_argument(
        "--data-root",
        default=from_env or os.path.relpath(REPO.parent / "shared" / "data"),
        help="holds cifar10_jpeg/ (default: $FEDCOMM_DATA_ROOT, else ../shared/data)",
    )
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES))
    p.add_argument("--pfl-python", type=Path, default=Path(".venv-pfl/bin/python"))
    p.add_argument("--pfl-sampler", choices=["fedcomm", "random"], default="fedcomm")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", choices=SIDES, help=argparse.SUPPRESS)
    p.add_argument("--dir", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.per_round is None:
        args.per_round = PAPER["per_round"] if args.paper_cohort else REDUCED["per_round"]
    if args.test_images is None:
        args.test_images = PAPER["test"] if args.paper_cohort else REDUCED["test"]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker is None:
        return driver(args)
    set_threads(args.threads)
    if args.worker == "pfl":
        result = pfl_worker(args)
    else:
        result = fedcomm_worker(args, args.worker.removeprefix("fedcomm-"))
    (args.dir / f"{args.worker}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
