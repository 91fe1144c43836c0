"""One-change ablations of the algorithms' vectorized rounds on W1 (see docs/speed.md).

Each variant changes one thing against the algorithm's default config, same seed; every variant
runs in its own process, 3 repeats interleaved, and reports the median s/round of rounds 2..:

- ``fedavg``: the reference round;
- ``fedbiad`` / ``fedbiad-no-noise``: FedBIAD, and FedBIAD with the weight noise ``s̃ε`` off
  (``s̃ = 0``: its local steps then draw nothing), which prices the noise generation;
- ``fedsparse`` / ``fedsparse-gate-weights``: FedSparse with ``gate_at: auto`` (input gating
  where cheaper) and with ``gate_at: weights`` (always ``W ⊙ z``).

    python benchmarks/ablations.py [--rounds 10] [--repeats 3] [--variants fedavg fedbiad ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import backends as bench  # the sibling script: same workload, same library runner

VARIANTS = ("fedavg", "fedbiad", "fedbiad-no-noise", "fedsparse", "fedsparse-gate-weights")


def one(variant: str, rounds: int, data_root: str) -> list[float]:
    """This process: one repeat of ``variant``; the round times."""
    from fedcomm.algorithms import CONFIGS
    from fedcomm.algorithms.fedbiad import algorithm as fedbiad

    algorithm = variant.split("-")[0]
    if variant == "fedbiad-no-noise":
        fedbiad.model_variance = lambda *a, **k: 0.0  # s̃ = 0: draws() returns zeros
    if variant == "fedsparse-gate-weights":
        sparse = CONFIGS["fedsparse"]
        bench.CONFIGS = {**CONFIGS, "fedsparse": lambda: sparse(gate_at="weights")}
    wl = bench.WORKLOADS["W1"]
    data, model, _ = bench.start_up(wl, data_root, 0)
    round_s, _ = bench.run_library(wl, data, model, rounds, 0, "vectorized", algorithm)
    return round_s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    root = os.environ.get(bench.DATA_ROOT_ENV) or str(bench.REPO.parent / "shared" / "data")
    p.add_argument("--data-root", default=root)
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.rounds, args.data_root)))
        return
    steady: dict[str, list[float]] = {v: [] for v in args.variants}
    for _ in range(args.repeats):  # interleaved: a noisy spell hits every variant
        for v in args.variants:
            cmd = [sys.executable, __file__, "--one", v, "--rounds", str(args.rounds)]
            cmd += ["--data-root", args.data_root]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            steady[v] += json.loads(out.strip().splitlines()[-1])[1:]
    base = statistics.median(steady["fedavg"]) if "fedavg" in steady else None
    for v, rounds in steady.items():
        median = statistics.median(rounds)
        vs = f"  {median / base:.2f}x FedAvg" if base else ""
        print(f"{v:<24} {median:.4f} s/round (median of {len(rounds)} rounds){vs}")


if __name__ == "__main__":
    main()
