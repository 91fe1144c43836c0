"""The Mahimahi links' medians that docs/system_study.md quotes, from the traces themselves.

    FEDCOMM_DATA_ROOT=... python pipeline/trace_medians.py

Per direction (Mbit/s, each trace's partial last second left out, as fedcomm.system.traces
reads them):

- ``pooled``: the median of every 1-s bin of every trace, pooled. Long traces weigh more (the
  downlink's two slowest, EVDO and UMTS, are 55% of its seconds), so this is not what a client
  of the population sees: each client draws one trace uniformly (system/population.py).
- ``per_second``: the median capacity of a client drawn from the population at a second drawn
  uniformly (every trace weighs the same; a per-second statistic, not a link's level).
- ``population``: the median over the population's clients of a client's mean capacity, the
  level of its link (a client's transfers read its trace cyclically, from a random start, over a
  run longer than the trace): the median over the traces of each trace's mean, since every trace
  is drawn with the same probability. With an even number of traces (6 uplinks) it is the
  midpoint of the middle two.

The ablation ``system_study_uniform_pop`` puts every client on constant links at
``population`` (rounded to 2 decimals); ``system_study_uniform`` used the pooled medians.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from fedcomm.system.traces import link_traces

DIRECTIONS: tuple[Literal["down", "up"], ...] = ("down", "up")


@dataclass(frozen=True)
class Medians:
    traces: int
    pooled: float
    per_second: float
    population: float


def _equal_weight_median(bins: list[np.ndarray]) -> float:
    """The median of the mixture that picks a trace uniformly, then one of its seconds."""
    values = np.concatenate(bins)
    weights = np.concatenate([np.full(len(b), 1.0 / len(b)) for b in bins])
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return float(values[order][np.searchsorted(cum, cum[-1] / 2)])


def medians(root: Path) -> dict[str, Medians]:
    out: dict[str, Medians] = {}
    for direction in DIRECTIONS:
        bins = [t.mbps for t in link_traces(root, "mahimahi", direction)]
        out[direction] = Medians(
            traces=len(bins),
            pooled=float(np.median(np.concatenate(bins))),
            per_second=_equal_weight_median(bins),
            population=float(np.median([b.mean() for b in bins])),
        )
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=os.environ.get("FEDCOMM_DATA_ROOT"))
    args = p.parse_args()
    if args.root is None:
        print("set FEDCOMM_DATA_ROOT (or --root): the data root with traces/", file=sys.stderr)
        return 2
    print("direction traces  pooled  per_second  population (Mbit/s)")
    for direction, m in medians(args.root).items():
        print(
            f"{direction:<9} {m.traces:>6}  {m.pooled:>6.2f}  {m.per_second:>10.2f}  "
            f"{m.population:>10.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
