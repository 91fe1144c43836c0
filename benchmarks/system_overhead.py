"""What simulated time costs a round (issue 30): W1 with and without a ``system`` section.

    python benchmarks/system_overhead.py [--reps 5] [--rounds 10] [--backend vectorized]
        [--out benchmarks/results/<date>_system_overhead.json]

W1 (benchmarks/backends.py: MNIST MLP 784-128-10, 1000 clients of 60 examples, 100 a round,
B = 10, E = 1) runs ``--rounds`` rounds per repetition under three settings, interleaved
(off, clock, deadline, off, clock, ...) so that a busy machine slows them alike:

- ``off``: no ``system`` section (today's loop);
- ``clock``: every client timed from its encoded bits and its FLOPs (lognormal links, uniform
  speeds), no deadline, so every client is aggregated: the same training, plus the clock;
- ``deadline``: the same population with a deadline that drops about a third of the clients
  (less server work; for information).

The clock adds no work per local step: per client it counts the nonzero weights once and does a
handful of float operations. Reported per setting, the first round of each repetition left out:
the median wall seconds of a round and the median process CPU seconds of a round (the CPU time is
the steadier of the two on a shared machine), and clock / off for both. One torch thread by
default (``--threads``), so that other processes on the machine do not make the threads spin.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import itertools

from backends import WORKLOADS, start_up
from fedcomm.algorithms import fedavg
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.simulation import loop
from fedcomm.system.config import SystemConfig

POPULATION: dict[str, Any] = {
    "links": {
        "down": {"kind": "lognormal", "median": 20.0, "sigma": 0.8},
        "up": {"kind": "lognormal", "median": 2.0, "sigma": 0.8},
        "latency_s": {"kind": "constant", "value": 0.05},
    },
    "compute": {"reference_flops": 1e9, "speed": {"kind": "uniform", "low": 0.3, "high": 3.0}},
}


def settings(deadline_s: float) -> dict[str, SystemConfig | None]:
    return {
        "off": None,
        "clock": SystemConfig.model_validate(POPULATION),
        "deadline": SystemConfig.model_validate(
            {**POPULATION, "policy": {"deadline_s": deadline_s}}
        ),
    }


def rounds_s(
    system: SystemConfig | None, data: Any, model: torch.nn.Module, rounds: int, backend: str
) -> tuple[list[float], list[float], list[dict[str, Any]]]:
    wl = WORKLOADS["W1"]
    cfg = loop.LoopConfig(
        rounds, wl.per_round, LocalConfig(epochs=1, batch_size=wl.batch, lr=wl.lr), seed=0,
        eval_every=rounds, local_eval_every=rounds, backend=backend, system=system,
    )  # fmt: skip
    stamps = [(time.perf_counter(), time.process_time())]
    res = loop.run(
        cfg, fedavg.build(fedavg.Config()), copy.deepcopy(model), data,
        build_compressor("none"), config_hash="bench",
        progress=lambda r, m: stamps.append((time.perf_counter(), time.process_time())),
    )  # fmt: skip
    wall = [b[0] - a[0] for a, b in itertools.pairwise(stamps)]
    cpu = [b[1] - a[1] for a, b in itertools.pairwise(stamps)]
    return wall, cpu, res.state.round_rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--backend", default="vectorized", choices=["vectorized", "sequential"])
    p.add_argument("--deadline-s", type=float, default=6.0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    root = os.environ.get(
        "FEDCOMM_DATA_ROOT", str(Path(__file__).resolve().parents[2] / "shared" / "data")
    )
    data, model, source = start_up(WORKLOADS["W1"], root, 0)
    per: dict[str, list[float]] = {name: [] for name in settings(args.deadline_s)}
    per_cpu: dict[str, list[float]] = {name: [] for name in settings(args.deadline_s)}
    dropped: list[float] = []
    for rep in range(args.reps):
        for name, system in settings(args.deadline_s).items():
            secs, cpu, rows = rounds_s(system, data, model, args.rounds, args.backend)
            per[name].extend(secs[1:])  # the first round of a run warms up
            per_cpu[name].extend(cpu[1:])
            if name == "deadline":
                dropped.extend(float(r["system/dropped"]) for r in rows)
            print(
                f"rep {rep} {name}: median {statistics.median(secs[1:]):.4f} s/round, "
                f"{statistics.median(cpu[1:]):.4f} CPU s/round",
                flush=True,
            )
    med = {name: statistics.median(v) for name, v in per.items()}
    med_cpu = {name: statistics.median(v) for name, v in per_cpu.items()}
    out = {
        "benchmark": "system_overhead",
        "workload": "W1",
        "data": source,
        "backend": args.backend,
        "reps": args.reps,
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "cpu": platform.processor() or platform.machine(),
        "loadavg": os.getloadavg(),
        "median_s_per_round": med,
        "median_cpu_s_per_round": med_cpu,
        "clock_over_off": med["clock"] / med["off"],
        "clock_over_off_cpu": med_cpu["clock"] / med_cpu["off"],
        "deadline_over_off": med["deadline"] / med["off"],
        "deadline_s": args.deadline_s,
        "deadline_mean_dropped": statistics.mean(dropped) if dropped else None,
        "samples": per,
        "samples_cpu": per_cpu,
    }
    print(json.dumps({k: v for k, v in out.items() if k != "samples"}, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
