"""Speed benchmark: plain FedAvg on MNIST through the library's round loop.

Workload: MLP 784-128-10; the 60,000 MNIST train images split IID over 1000 clients of 60;
100 clients per round, 1 local epoch, batch 10, lr 0.05; server SGD lr 1; the global model is
evaluated every round on the 10,000 official test images (clients have no test split).

    python benchmarks/fedavg_mnist.py [--rounds 20] [--repeats 1] [--threads N]
                                      [--data-root PATH] [--json out.json]

Start-up (data load + partition + tensors + model build) is timed apart from the rounds.
Round times come from the loop's ``progress`` callback; the breakdown uses the loop's own
``time/client_s`` metric (mean client local training, times clients per round) and a timing
wrapper around ``evaluate`` (global vs per-client evaluation). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

import torch
from rich.console import Console
from rich.table import Table

from fedcomm.algorithms import build_algorithm, fedavg
from fedcomm.algorithms.core import ClientData
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.data.datasets.registry import load_dataset
from fedcomm.data.datasets.verify import DATA_ROOT_ENV
from fedcomm.data.federated import PartitionSpec, make_partition
from fedcomm.data.types import Dataset
from fedcomm.evaluation.metrics import evaluate
from fedcomm.models import build_model
from fedcomm.seeding import Stream, torch_generator
from fedcomm.simulation import global_eval, local_eval, loop
from fedcomm.simulation.data import FederatedTensors

REPO = Path(__file__).resolve().parents[1]
N_TRAIN, CLIENTS, PER_ROUND = 60_000, 1000, 100


class EvalTimer:
    """Wraps ``evaluate``: seconds spent on the global test set vs client test splits."""

    def __init__(self, inner: Callable[..., Any], global_test_x: torch.Tensor) -> None:
        self.inner, self.global_test_x = inner, global_test_x
        self.global_s = self.local_s = 0.0

    def __call__(self, model: Any, params: Any, x: torch.Tensor, *a: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        out = self.inner(model, params, x, *a, **kw)
        dt = time.perf_counter() - t0
        if x is self.global_test_x:
            self.global_s += dt
        else:
            self.local_s += dt
        return out


def start_up(data_root: str, seed: int) -> tuple[FederatedTensors, torch.nn.Module]:
    """MNIST train rows over 1000 IID clients, the 10k test rows as the global test set."""
    pool = load_dataset("mnist", data_root)  # official train first, then test
    train = Dataset("mnist", pool.x[:N_TRAIN], pool.y[:N_TRAIN], pool.num_classes)
    part = make_partition(train, PartitionSpec("iid", CLIENTS, {}, 0.0, seed))
    data = FederatedTensors.build(train, part.train, part.test)  # client test splits are empty
    test = ClientData(torch.from_numpy(pool.x[N_TRAIN:]), torch.from_numpy(pool.y[N_TRAIN:]).long())
    data = dataclasses.replace(data, global_test=test)
    gen = torch_generator(seed, Stream.INIT)  # as stages.train.build_run_model seeds it
    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen)))
    model = build_model("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=[128])
    return data, model


def one_repeat(rounds: int, data_root: str, seed: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    data, model = start_up(data_root, seed)
    startup_s = time.perf_counter() - t0
    local = LocalConfig(epochs=1, batch_size=10, lr=0.05)
    cfg = loop.LoopConfig(rounds, PER_ROUND, local, seed, eval_every=1)
    algorithm, compressor = build_algorithm(fedavg.Config()), build_compressor("none")
    timer = EvalTimer(evaluate, data.global_test.x)
    stamps: list[float] = []
    evals: list[tuple[float, float]] = []

    def progress(round_: int, metrics: Any) -> None:
        stamps.append(time.perf_counter())
        evals.append((timer.global_s, timer.local_s))
        timer.global_s = timer.local_s = 0.0

    with (  # the loop's evaluations, timed: local in loop, global in global_eval
        patch.object(local_eval, "evaluate", timer),
        patch.object(global_eval, "evaluate", timer),
    ):
        t_run = time.perf_counter()
        result = loop.run(
            cfg, algorithm, model, data, compressor, config_hash="b", progress=progress
        )
    round_s = [b - a for a, b in zip([t_run, *stamps[:-1]], stamps, strict=True)]
    rows = result.state.round_rows
    train = [float(r["time/client_s"]) * PER_ROUND for r in rows]
    return {
        "startup_s": startup_s,
        "round_s": round_s,
        "train_s": train,
        "global_eval_s": [g for g, _ in evals],
        "local_eval_s": [lo for _, lo in evals],
        "rest_s": [r - t - g - lo for r, t, (g, lo) in zip(round_s, train, evals, strict=True)],
        "final_accuracy": rows[-1]["global/accuracy"],
    }


def summarize(reps: list[dict[str, Any]]) -> dict[str, Any]:
    """Pool rounds 2.. of every repeat (round 1 includes one-off warm-up)."""

    def pooled(key: str) -> list[float]:
        return [v for rep in reps for v in (rep[key][1:] or rep[key])]

    steady = pooled("round_s")
    return {
        "round_s_median": statistics.median(steady),
        "round_s_mean": statistics.mean(steady),
        "round_s_min": min(steady),
        "round_s_max": max(steady),
        "first_round_s": statistics.median(rep["round_s"][0] for rep in reps),
        "startup_s": statistics.median(rep["startup_s"] for rep in reps),
        "breakdown_s": {
            k: statistics.mean(pooled(k))
            for k in ("train_s", "global_eval_s", "local_eval_s", "rest_s")
        },
        "final_accuracy": reps[-1]["final_accuracy"],
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "cpu_count": os.cpu_count(),
    }


def report(s: dict[str, Any], rounds: int, repeats: int) -> None:
    table = Table(
        title=f"FedAvg MNIST MLP, {CLIENTS} clients, {PER_ROUND}/round, "
        f"{rounds} rounds x {repeats} repeat(s)"
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    median, mean = s["round_s_median"], s["round_s_mean"]
    table.add_row("s/round median (rounds 2..)", f"{median:.3f}")
    table.add_row("s/round mean (= 100% below)", f"{mean:.3f}")
    table.add_row("s/round min / max", f"{s['round_s_min']:.3f} / {s['round_s_max']:.3f}")
    table.add_row("first round s", f"{s['first_round_s']:.3f}")
    table.add_row("start-up s", f"{s['startup_s']:.2f}")
    b = s["breakdown_s"]
    labels = {
        "train_s": f"  local training (mean client x {PER_ROUND})",
        "global_eval_s": "  global evaluation (10k test)",
        "local_eval_s": "  client evaluation (empty splits)",
        "rest_s": "  rest (ledger, aggregation, metrics)",
    }
    for key, label in labels.items():
        table.add_row(label, f"{b[key]:.3f} s  {100 * b[key] / mean:5.1f}%")
    table.add_row("peak RSS MiB", f"{s['peak_rss_mib']:.0f}")
    table.add_row("final global accuracy", f"{s['final_accuracy']:.4f}")
    table.add_row("torch threads / CPUs", f"{s['torch_threads']} / {s['cpu_count']}")
    table.add_row("torch", s["torch_version"])
    console = Console()
    console.print(table)
    if s["round_s_max"] > 3 * median:
        console.print("[yellow]noisy: slowest round > 3x median; cores shared? try --threads 1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    p.add_argument("--seed", type=int, default=0)
    root = os.environ.get(DATA_ROOT_ENV) or str(REPO.parent / "shared" / "data")
    p.add_argument(
        "--data-root", default=root, help=f"${DATA_ROOT_ENV} or <repo>/../shared/data: {root}"
    )
    p.add_argument("--json", type=Path, default=None, help="write the numbers here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    reps = [one_repeat(args.rounds, args.data_root, args.seed) for _ in range(args.repeats)]
    summary = summarize(reps)
    report(summary, args.rounds, args.repeats)
    if args.json is not None:
        out = {"args": {k: str(v) for k, v in vars(args).items()}, **summary, "repeats": reps}
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
