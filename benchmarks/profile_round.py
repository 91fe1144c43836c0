"""Where a round's time goes: the torch profiler over steady rounds of a backends.py workload.

    python benchmarks/profile_round.py [--workload W1] [--runner vectorized] [--rounds 3]
                                       [--threads N]

Runs two warm-up rounds, then profiles ``--rounds`` rounds of the same ``loop.run`` call that
``benchmarks/backends.py`` times, and prints the operators by self CPU time per round (ms) with
their share of the profiled time, plus the Python-level hot spots (cProfile, tottime).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
import backends as bench  # the sibling script: same workloads and runners


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workload", default="W1", choices=list(bench.WORKLOADS))
    p.add_argument(
        "--runner", default="vectorized", choices=[k for k, r in bench.RUNNERS.items() if not r.env]
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    root = os.environ.get(bench.DATA_ROOT_ENV) or str(bench.REPO.parent / "shared" / "data")
    p.add_argument("--data-root", default=root)
    args = p.parse_args()
    if args.threads:  # 1 on a shared, loaded host (docs/speed.md, issue 27)
        torch.set_num_threads(args.threads)
    wl, runner = bench.WORKLOADS[args.workload], bench.RUNNERS[args.runner]
    if runner.kind != "library":
        raise SystemExit("profile_round.py profiles the library's runners, not 'plain'")
    data, model, _ = bench.start_up(wl, args.data_root, 0)
    bench.run_library(wl, data, model, 2, 0, runner.backend, runner.algorithm)  # warm-up
    data, model, _ = bench.start_up(wl, args.data_root, 0)
    py = cProfile.Profile()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        py.enable()
        round_s, _ = bench.run_library(
            wl, data, model, args.rounds, 0, runner.backend, runner.algorithm
        )
        py.disable()
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    print(f"{args.workload} {args.runner}: rounds {[f'{s:.3f}' for s in round_s]} s (profiled)")
    print(f"{'operator':<40} {'ms/round':>9} {'share':>7} {'calls/round':>12}")
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    for e in events[: args.top]:
        print(
            f"{e.key[:40]:<40} {e.self_cpu_time_total / 1e3 / args.rounds:9.1f} "
            f"{100 * e.self_cpu_time_total / total:6.1f}% {e.count / args.rounds:12.0f}"
        )
    out = io.StringIO()
    pstats.Stats(py, stream=out).sort_stats("tottime").print_stats(args.top)
    print(out.getvalue())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
