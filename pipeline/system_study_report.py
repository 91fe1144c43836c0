"""The worked study of simulated time (docs/system_study.md): its tables and figures, computed from
the per-seed curves that pipeline/per_seed.sh committed under docs/system_study/data/.

    python pipeline/system_study_report.py [--write | --check]

Per condition (a build name: the profile, its deadline variant, the ablations) and algorithm,
over seeds (mean ± SE): the final accuracy (mean of the last 5 evaluations), GiB moved (up +
down), simulated hours, the GiB and the simulated hours to reach each target accuracy, and the
share of sampled clients dropped (at the evaluated rounds). Then the two rankings, by GiB to the
target and by simulated hours to it, and every pair of algorithms that the two put in opposite
orders, each side decided by the paired one-sided t rule over seeds
(fedcomm.reporting.verdict.paired, docs/reproductions/README.md). ``--write`` rewrites the
block between the page's markers and the figures; ``--check`` exits 1 when the page's block is not
what the data give (a test runs it).
"""

from __future__ import annotations

import itertools
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import page_block  # pipeline/page_block.py, beside this file
import polars as pl

from fedcomm.evaluation.curve_points import first_round_reaching
from fedcomm.evaluation.sim_time import HOUR_S, SIM_ELAPSED, sim_hours_to_target
from fedcomm.reporting.plots import plot_accuracy_vs_gib_and_sim_time
from fedcomm.reporting.verdict import paired, t_text

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs/system_study/data"
PAGE = ROOT / "docs/system_study.md"
IMG = ROOT / "docs/img"
BEGIN, END = "<!-- study:begin (pipeline/system_study_report.py) -->", "<!-- study:end -->"
CONDITIONS = {  # build name -> what it is
    "system_study": "Mahimahi links, AI-Benchmark phones, no deadline",
    "system_study_deadline": "the same population, a 5 s deadline",
    "system_study_uniform": "no deadline, every client on constant links at the traces' pooled "
    "per-second medians (ablation)",
    "system_study_uniform_pop": "no deadline, every client on constant links at the population's "
    "median link (ablation)",
}
TARGET = 0.9
LAST_K = 5
ACCURACY, GIB = "global/accuracy", "comm/cum_gib"
RENAMES = {  # curves.csv column -> the rounds table's, for the library's summaries and plots
    "comm_cum_gib": GIB,
    "global_accuracy": ACCURACY,
    "time_sim_elapsed_s": SIM_ELAPSED,
}


@dataclass(frozen=True)
class Seed:
    final: float
    gib: float
    hours: float
    gib_to: float  # inf: never reached
    hours_to: float
    dropped: float  # share of the sampled clients dropped, at the evaluated rounds


def load(data: Path) -> dict[str, pl.DataFrame]:
    """Each condition's curves (every seed's file stacked), for the conditions that have any."""
    out = {}
    for name in CONDITIONS:
        files = sorted(data.glob(f"{name}_s[0-9]*.csv"))
        if files:
            out[name] = pl.concat([pl.read_csv(f) for f in files], how="diagonal_relaxed")
    return out


def per_seed(curves: pl.DataFrame) -> dict[str, dict[int, Seed]]:
    """Run -> seed -> its numbers."""
    out: dict[str, dict[int, Seed]] = {}
    for (run, seed), g in curves.sort("round").group_by(["run", "seed"], maintain_order=True):
        g = g.filter(pl.col("global_accuracy").is_not_null()).rename(RENAMES)  # rounds-table names
        hit = first_round_reaching(g, ACCURACY, TARGET)
        hours_to = sim_hours_to_target(g, ACCURACY, TARGET)
        share = (g["system_dropped"] / g["system_sampled"]).mean()
        out.setdefault(str(run), {})[int(seed)] = Seed(
            final=float(g[ACCURACY].tail(LAST_K).mean()),  # type: ignore[arg-type]
            gib=float(g[GIB].max()),  # type: ignore[arg-type]
            hours=float(g[SIM_ELAPSED].max()) / HOUR_S,  # type: ignore[arg-type]
            gib_to=math.inf if hit is None else float(g.filter(pl.col("round") == hit)[GIB][0]),
            hours_to=math.inf if hours_to is None else hours_to,
            dropped=float(share),  # type: ignore[arg-type]
        )
    return out


def mean_se(values: list[float]) -> tuple[float, float]:
    n = len(values)
    m = sum(values) / n
    if n < 2 or math.isinf(m):
        return m, 0.0
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1) / n)


def shown(values: list[float], digits: int, scale: float = 1.0) -> str:
    if any(math.isinf(v) for v in values):
        reached = sum(not math.isinf(v) for v in values)
        return f"not reached ({len(values) - reached} of {len(values)} seeds)"
    m, se = mean_se([v * scale for v in values])
    return f"{m:.{digits}f} ± {se:.{digits}f}"


def table(runs: dict[str, dict[int, Seed]]) -> list[str]:
    pct = int(TARGET * 100)
    lines = [
        f"| run | seeds | final accuracy (%) | GiB | simulated h | GiB to {pct}% | "
        f"simulated h to {pct}% | dropped (evaluated rounds) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run, seeds in runs.items():
        s = list(seeds.values())
        lines.append(
            f"| {run} | {len(s)} | {shown([x.final for x in s], 2, 100)} | "
            f"{shown([x.gib for x in s], 2)} | {shown([x.hours for x in s], 3)} | "
            f"{shown([x.gib_to for x in s], 3)} | {shown([x.hours_to for x in s], 4)} | "
            f"{shown([x.dropped for x in s], 1, 100)}% |"
        )
    return lines


def ranking(runs: dict[str, dict[int, Seed]], key: str) -> list[str]:
    """Runs ordered by the mean of ``key`` (fewest first; never reached last)."""
    return sorted(runs, key=lambda r: mean_se([getattr(x, key) for x in runs[r].values()])[0])


def flips(runs: dict[str, dict[int, Seed]]) -> list[tuple[str, str]]:
    """Pairs (a, b) that GiB to the target ranks a before b and simulated hours b before a."""
    by_gib = ranking(runs, "gib_to")
    by_hours = ranking(runs, "hours_to")
    return [
        (a, b)
        for a, b in itertools.combinations(by_gib, 2)  # a before b by GiB
        if by_hours.index(b) < by_hours.index(a)
    ]


def _values(seeds: dict[int, Seed], key: str) -> dict[int, float]:
    return {s: getattr(x, key) for s, x in seeds.items() if not math.isinf(getattr(x, key))}


def decided(runs: dict[str, dict[int, Seed]], a: str, b: str, key: str, unit: str) -> str:
    """``a − b`` of ``key`` over seeds, with the rule's verdict for the side its mean is on."""
    va, vb = _values(runs[a], key), _values(runs[b], key)
    probe = paired(va, vb)
    side: Literal["less", "greater"] = "less" if (probe.mean or 0.0) < 0 else "greater"
    p = paired(va, vb, direction=side)
    word = "fewer" if side == "less" else "more"
    digits = 3 if unit == "GiB" else 4
    if p.mean is None or p.se is None or p.t is None:
        return f"{a} {word}: {p.verdict} (n = {p.n})"
    return (
        f"{a} − {b} = {p.mean:+.{digits}f} ± {p.se:.{digits}f} {unit} (t = {t_text(p.t)}, "
        f"n = {p.n}): {a} needs {word}, **{p.verdict}**"
    )


def block(conditions: dict[str, pl.DataFrame]) -> str:
    pct = int(TARGET * 100)
    out = [BEGIN, ""]
    first = per_seed(next(iter(conditions.values())))
    pairs = flips(first)  # the pairs the main condition's two rankings put in opposite orders
    out.append(
        "Pairs that the first condition's two rankings put in opposite orders: "
        + (", ".join(f"{a} / {b}" for a, b in pairs) or "none")
        + "; each is decided in every condition below, on each side by the paired t rule."
    )
    out.append("")
    for name, curves in conditions.items():
        runs = per_seed(curves)
        out += [f"### `{name}`: {CONDITIONS[name]}", "", *table(runs), ""]
        out.append(f"- ranked by GiB to {pct}%: {' < '.join(ranking(runs, 'gib_to'))}")
        out.append(
            f"- ranked by simulated hours to {pct}%: {' < '.join(ranking(runs, 'hours_to'))}"
        )
        if not flips(runs):
            out.append("- the two rankings agree")
        for a, b in pairs:
            if a in runs and b in runs:
                out.append(
                    f"- **{a} vs {b}** to {pct}%: GiB {decided(runs, a, b, 'gib_to', 'GiB')}; "
                    f"simulated hours {decided(runs, a, b, 'hours_to', 'h')}"
                )
        out += ["", f"![{name}](img/{name}.png)", ""]
    out.append(END)
    return "\n".join(out)


def figures(conditions: dict[str, pl.DataFrame], img: Path) -> None:
    for name, curves in conditions.items():
        runs = {
            str(run): [
                g.rename({k: v for k, v in RENAMES.items() if k in g.columns}).sort("round")
                for _, g in c.group_by("seed", maintain_order=True)
            ]
            for (run,), c in curves.group_by(["run"], maintain_order=True)
        }
        plot_accuracy_vs_gib_and_sim_time(
            runs, img / f"{name}.png", title=f"{name}: {CONDITIONS[name]}"
        )


def main() -> int:
    return page_block.run(
        __doc__ or "", load=load, block=block, figures=figures, data=DATA, page=PAGE, img=IMG,
        begin=BEGIN, end=END,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
