"""Measured rounds of the paper-scale profiles, and the whole table's CPU hours projected from them.

    python benchmarks/paper_rounds.py pipeline/reproductions/fedsparse_cifar10.yaml \\
        [--runs fedavg fedsparse_mid] [--rounds 3] [--backend auto] [--threads N] [--json out]

Each (profile, run) is a process of its own, built as the train stage builds it (the profile's
data under the data root, its partition, model, algorithm, uplink codec and ``train`` block,
seed = the profile's first), so its peak RSS is its own. Only the loop's length and the global
evaluation change: ``--rounds R`` rounds, the global test evaluation in the last round only
(``eval_every`` past the end; the clients' local evaluation stays as the profile asks). So

- **train s/round**: median of rounds 2 .. R-1 (round 1 warms up; a training round with the
  profile's local evaluation, without the global one);
- **eval round s**: round R (the same plus the global test evaluation); the evaluation's own
  cost is the difference;
- **projected CPU hours of the table** = seeds x sum over runs of rounds x (train s/round +
  eval cost / eval_every), in hours: *projected from measured rounds*, not a measured run.

Times are wall seconds of this process and its CPU seconds (all threads); on a shared, loaded
host the CPU seconds are the steadier number. ``--synthetic`` replaces the profile's dataset
with seeded random tensors of the shapes given (for a dataset absent from the data root, e.g.
CIFAR-100 for ProgFed); the result's ``data`` says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
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

from fedcomm.comm.codecs import build_compressor
from fedcomm.config import Params, load_params
from fedcomm.data.datasets.verify import DATA_ROOT_ENV
from fedcomm.data.types import Dataset
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors
from fedcomm.stages import partition, train

REPO = Path(__file__).resolve().parents[1]


def _dataset(params: Params, synthetic: list[int] | None, seed: int) -> tuple[Dataset, str]:
    if not synthetic:
        return partition.load_data(params), params.data.dataset.name
    n, classes, *shape = synthetic  # --synthetic 60000 100 3 32 32
    g = np.random.default_rng(seed)
    x = g.random((n, *shape), dtype=np.float32)
    y = np.arange(n) % classes  # every class equally often (label-based partitions need it)
    g.shuffle(y)
    return Dataset("synthetic", x, y, classes), f"synthetic {tuple(shape)} x {n}, {classes} classes"


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(
    profile: Path,
    run: str,
    rounds: int,
    backend: str | None,
    synthetic: list[int] | None,
    eval_batch_size: int | None = None,
) -> dict[str, Any]:
    """Rounds of one run of ``profile`` in this process: per-round wall and CPU seconds and RSS."""
    params = load_params(profile)
    seed = params.experiment.seeds[0]
    t0 = time.perf_counter()
    dataset, source = _dataset(params, synthetic, seed)
    part = partition.draw_partition(params, dataset)
    data = FederatedTensors.build(dataset, part.train, part.test)
    del dataset
    model, algorithm = train.check_run(params, run, seed, data)
    comp_cfg = params.algorithm(run).uplink or params.train.compressor
    compressor = build_compressor(comp_cfg.name, **comp_cfg.model_dump(exclude={"name"}))
    cfg = dataclasses.replace(
        train.loop_config(params, seed, run),
        rounds=rounds,
        eval_every=10**9,  # the global evaluation in the last round only
        checkpoint_every=10**9,
        **({"backend": backend} if backend else {}),
        **({"eval_batch_size": eval_batch_size} if eval_batch_size else {}),
    )
    startup = time.perf_counter() - t0
    wall, cpu, rss = [], [], []
    w0, c0 = time.perf_counter(), time.process_time()

    def tick(round_: int, metrics: Any) -> None:
        nonlocal w0, c0
        w1, c1 = time.perf_counter(), time.process_time()
        wall.append(w1 - w0)
        cpu.append(c1 - c0)
        rss.append(_rss_mib())
        w0, c0 = w1, c1

    result = loop.run(cfg, algorithm, model, data, compressor, config_hash="bench", progress=tick)
    last = result.state.round_rows[-1]
    return {
        "profile": os.path.relpath(profile, REPO),
        "run": run,
        "data": source,
        "model": params.model.name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "clients_per_round": params.train.clients_per_round,
        "local": params.train.local.model_dump(),
        "backend_requested": cfg.backend,
        "backend_ran": result.backend,
        "eval_batch_size": cfg.eval_batch_size,
        "threads": torch.get_num_threads(),
        "startup_s": startup,
        "round_s": wall,
        "round_cpu_s": cpu,
        "rss_mib_after_round": rss,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "last_round_metrics": {k: v for k, v in last.items() if isinstance(v, int | float)},
        "profile_rounds": params.train.rounds,
        "profile_eval_every": params.train.eval_every,
        "seeds": len(params.experiment.seeds),
        "loadavg_1min": os.getloadavg()[0],
    }


def summarize(rep: dict[str, Any]) -> dict[str, Any]:
    """Train s/round, eval round, and this run's projected CPU hours over the profile's seeds."""
    wall, cpu = rep["round_s"], rep["round_cpu_s"]
    mid = slice(1, -1) if len(wall) > 2 else slice(0, -1)
    train_w, train_c = statistics.median(wall[mid]), statistics.median(cpu[mid])
    eval_w, eval_c = wall[-1] - train_w, cpu[-1] - train_c  # the global evaluation's cost
    R, every, seeds = rep["profile_rounds"], rep["profile_eval_every"], rep["seeds"]
    per_run_c = R * train_c + (R // every) * eval_c  # CPU seconds of one seed's whole run
    per_run_w = R * train_w + (R // every) * eval_w
    return {
        "train_s_per_round": train_w,
        "train_cpu_s_per_round": train_c,
        "eval_round_s": wall[-1],
        "eval_round_cpu_s": cpu[-1],
        "projected_run_hours_wall": per_run_w / 3600,
        "projected_run_hours_cpu": per_run_c / 3600,
        "projected_seeds_hours_cpu": seeds * per_run_c / 3600,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("profile", type=Path)
    p.add_argument("--runs", nargs="+", default=None, help="default: the profile's runs")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--backend", choices=["sequential", "vectorized", "auto"], default=None)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--eval-batch-size",
        type=int,
        default=None,
        help="examples per evaluation batch (default: the profile's train.eval_batch_size)",
    )
    p.add_argument(
        "--synthetic",
        type=int,
        nargs="+",
        metavar="N",
        help="random data instead: examples classes C H W (e.g. 60000 100 3 32 32)",
    )
    p.add_argument(
        "--data-root", default=None, help="default: $FEDCOMM_DATA_ROOT or ../shared/data"
    )
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", metavar="RUN", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rounds < 2:
        raise SystemExit("--rounds: at least 2 (training rounds, then one with the evaluation)")
    os.environ.setdefault(DATA_ROOT_ENV, args.data_root or str(REPO.parent / "shared" / "data"))
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        rep = worker(
            args.profile,
            args.worker,
            args.rounds,
            args.backend,
            args.synthetic,
            args.eval_batch_size,
        )
        args.out.write_text(json.dumps(rep))
        return
    runs = args.runs or load_params(args.profile).experiment.runs
    results = []
    for run in runs:
        with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
            cmd = [sys.executable, __file__, str(args.profile), "--worker", run, "--out", tmp.name]
            cmd += ["--rounds", str(args.rounds)]
            for flag in ("backend", "threads", "eval_batch_size"):
                if getattr(args, flag):
                    cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
            if args.synthetic:
                cmd += ["--synthetic", *map(str, args.synthetic)]
            subprocess.run(cmd, check=True)
            rep = json.loads(Path(tmp.name).read_text())
        rep |= summarize(rep)
        results.append(rep)
        print(
            f"{rep['run']:>16} [{rep['backend_ran']}, {rep['threads']} thr, {rep['data']}]: "
            f"train {rep['train_s_per_round']:.2f} s/round ({rep['train_cpu_s_per_round']:.2f} "
            f"CPU s), eval round {rep['eval_round_s']:.2f} s ({rep['eval_round_cpu_s']:.2f} CPU "
            f"s), peak RSS {rep['peak_rss_mib']:.0f} MiB; projected {rep['seeds']} seeds x "
            f"{rep['profile_rounds']} rounds: {rep['projected_seeds_hours_cpu']:.1f} CPU h "
            f"(load {rep['loadavg_1min']:.1f})",
            flush=True,
        )
    total = sum(r["projected_seeds_hours_cpu"] for r in results)
    print(f"projected from measured rounds: {total:.1f} CPU hours for {len(results)} runs")
    if args.json is not None:
        args.json.write_text(json.dumps({"args": sys.argv[1:], "results": results}, indent=2))


if __name__ == "__main__":
    main()
