"""docs/time_policies.md's results: the measures, comparisons and figures of issue 45's worked
study, computed from the committed per-seed curves (docs/time_policies/data/).

    .venv/bin/python pipeline/time_policies_report.py           print the results block
    .venv/bin/python pipeline/time_policies_report.py --write   rewrite it in the page and figures
    .venv/bin/python pipeline/time_policies_report.py --check   exit 1 if the page is out of date

The design (arms, measures, budgets, comparisons and their directions) is the page's, registered
before the runs: ``acc@B`` is the best global accuracy among the evaluations at or before ``B``
simulated hours, ``J@0.08`` the clients' radio joules at the last evaluation at or before
0.08 h, ``J to 85%`` the joules at the first evaluation at 85% or more. Each comparison is the
paired one-sided t rule on the per-seed differences (``fedcomm.reporting.verdict.paired``).
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import page_block  # pipeline/page_block.py, beside this file
import polars as pl

from fedcomm.evaluation.sim_time import HOUR_S, SIM_ELAPSED
from fedcomm.reporting.plots import plot_accuracy_vs_energy, plot_accuracy_vs_gib_and_sim_time
from fedcomm.reporting.verdict import paired, shown_decimals, t_text
from fedcomm.system.energy import CUM_J

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "docs/time_policies/data"
PAGE = ROOT / "docs/time_policies.md"
IMG = ROOT / "docs/img"
BEGIN, END = "<!-- results:begin (pipeline/time_policies_report.py) -->", "<!-- results:end -->"

BUDGETS_H = (0.02, 0.05, 0.08)
DENSITY = {"fixed25": "0.25"}  # a fixed arm's DGC density (the others: 0.01)
TARGET = 0.85
ARMS = ("sync", "fedbuff", "fit", "fixed25")
CONDITIONS = {  # the build-name prefix of each condition -> what it is
    "time_policies": "Mahimahi links, AI-Benchmark phones, a 5 s deadline (the registered arms)",
    "time_policies_median": "ablation (a): every client on constant links at the population's "
    "median link (5.03 down, 1.43 up Mbit/s)",
    "time_policies_k100": "ablation (b): FedBuff with a step every 100 arrivals",
    "time_policies_d25": "ablation (c), added after the data: synchronous with DGC at a fixed "
    "density of 0.25 for every client (fit's most common setting), against the main sync and fit",
}
ACCURACY, GIB = "global/accuracy", "comm/cum_gib"
RENAMES = {
    "comm_cum_gib": GIB,
    "global_accuracy": ACCURACY,
    "time_sim_elapsed_s": SIM_ELAPSED,
    "energy_cum_j": CUM_J,
}


@dataclass(frozen=True)
class Seed:
    """One seed's measures (``nan``: not defined, e.g. 85% never reached)."""

    acc: dict[float, float]  # B -> best accuracy at or before B hours
    joules_at: float  # radio J at the last evaluation at or before 0.08 h
    joules_to: float  # radio J at the first evaluation at TARGET or more
    hours: float  # the run's simulated hours
    staleness: float  # mean staleness of the aggregated uploads (FedBuff), else nan
    setting: float  # mean DGC density sent (fit_deadline), else nan


def measures(curve: pl.DataFrame) -> Seed:
    """The registered measures of one seed's curve (every evaluated round of one run)."""
    c = curve.filter(pl.col("global_accuracy").is_not_null()).sort("round")
    hours = (c["time_sim_elapsed_s"] / HOUR_S).to_list()
    acc = c["global_accuracy"].to_list()
    joules = c["energy_cum_j"].to_list()
    at = {b: max((a for a, h in zip(acc, hours, strict=True) if h <= b), default=math.nan)
          for b in BUDGETS_H}  # fmt: skip
    last = [j for j, h in zip(joules, hours, strict=True) if h <= BUDGETS_H[-1]]
    reach = [j for j, a in zip(joules, acc, strict=True) if a >= TARGET]

    def mean_of(column: str) -> float:
        if column not in curve.columns:
            return math.nan
        v = curve[column].drop_nulls()
        return float(v.mean()) if len(v) else math.nan  # type: ignore[arg-type]

    return Seed(
        acc=at,
        joules_at=last[-1] if last else math.nan,
        joules_to=reach[0] if reach else math.nan,
        hours=hours[-1] if hours else math.nan,
        staleness=mean_of("system_staleness_mean"),
        setting=mean_of("system_uplink_setting"),
    )


def load(data: Path) -> dict[str, dict[str, dict[int, pl.DataFrame]]]:
    """condition -> arm -> seed -> its curve, for the files present."""
    out: dict[str, dict[str, dict[int, pl.DataFrame]]] = {}
    for path in sorted(data.glob("*.csv")):
        m = re.fullmatch(
            r"(time_policies(?:_median|_k100|_d25)?)_(sync|fedbuff|fit)_s(\d+)", path.stem
        )
        if m is None:
            continue
        cond, arm, seed = m.group(1), m.group(2), int(m.group(3))
        if cond == "time_policies_d25":  # its one arm: synchronous at a fixed density of 0.25
            arm = "fixed25"
        out.setdefault(cond, {}).setdefault(arm, {})[seed] = pl.read_csv(path)
    return out


def mean_se(values: list[float]) -> str:
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return "not reached"
    m = sum(vals) / len(vals)
    se = (
        math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1) / len(vals))
        if len(vals) > 1
        else 0.0
    )
    d = shown_decimals(se, m)
    missing = (
        f" ({len(values) - len(vals)} of {len(values)} not reached)"
        if len(vals) < len(values)
        else ""
    )
    return f"{m:.{d}f} ± {se:.{d}f}{missing}"


def table(arms: dict[str, dict[int, Seed]]) -> list[str]:
    head = [
        "arm", "seeds", *(f"acc@{b} h (%)" for b in BUDGETS_H), "simulated h", "J@0.08 h (kJ)",
        f"kJ to {int(TARGET * 100)}%", "mean staleness", "mean density sent",
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for arm in ARMS:
        if arm not in arms:
            continue
        seeds = list(arms[arm].values())
        cells = [
            arm,
            str(len(seeds)),
            *(mean_se([100 * s.acc[b] for s in seeds]) for b in BUDGETS_H),
            mean_se([s.hours for s in seeds]),
            mean_se([s.joules_at / 1e3 for s in seeds]),
            mean_se([s.joules_to / 1e3 for s in seeds]),
            mean_se([s.staleness for s in seeds]) if arm == "fedbuff" else "0",
            mean_se([s.setting for s in seeds]) if arm == "fit" else DENSITY.get(arm, "0.01"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def compare(
    arms: dict[str, dict[int, Seed]], a: str, what: str, scale: float, unit: str,
    pick: Callable[[Seed], float], b: str = "sync",
) -> str:  # fmt: skip
    """``a − b`` of a measure, decided "> 0" by the paired rule."""
    va = {s: pick(x) for s, x in arms[a].items() if not math.isnan(pick(x))}
    vb = {s: pick(x) for s, x in arms[b].items() if not math.isnan(pick(x))}
    p = paired(va, vb, direction="greater", scale=scale)
    if p.mean is None or p.se is None or p.t is None:
        return f"- {a} − {b}, {what} > 0: {p.verdict} (n = {p.n})"
    d = shown_decimals(p.se, p.mean)
    return (
        f"- {a} − {b}, {what} > 0: {p.mean:+.{d}f} ± {p.se:.{d}f} {unit} "
        f"(t = {t_text(p.t)}, n = {p.n}): **{p.verdict}**"
    )


def _acc_at(hours: float) -> Callable[[Seed], float]:
    return lambda s: s.acc[hours]


def comparisons(arms: dict[str, dict[int, Seed]], budgets: tuple[float, ...]) -> list[str]:
    out = []
    if "fixed25" in arms:  # ablation (c), after the data: DGC at 0.25 for every client
        return [
            compare(arms, "fixed25", "acc@0.05 h", 100, "points", lambda s: s.acc[0.05]),
            compare(arms, "fit", "acc@0.05 h", 100, "points", lambda s: s.acc[0.05], "fixed25"),
        ]
    for a in ("fit", "fedbuff"):
        if a not in arms or "sync" not in arms:
            continue
        for hours in budgets:
            out.append(compare(arms, a, f"acc@{hours} h", 100, "points", _acc_at(hours)))
    if {"fit", "sync"} <= arms.keys() and budgets == BUDGETS_H:
        out.append(compare(arms, "fit", f"J to {int(TARGET * 100)}%", 1e-3, "kJ",
                           lambda s: s.joules_to))  # fmt: skip
    if {"fedbuff", "sync"} <= arms.keys() and budgets == BUDGETS_H:
        out.append(compare(arms, "fedbuff", "J@0.08 h", 1e-3, "kJ", lambda s: s.joules_at))
    return out


def block(data: dict[str, dict[str, dict[int, pl.DataFrame]]]) -> str:
    out = [BEGIN, ""]
    for cond, what in CONDITIONS.items():
        if cond not in data:
            continue
        arms = {
            arm: {s: measures(c) for s, c in seeds.items()} for arm, seeds in data[cond].items()
        }
        main = data.get("time_policies", {})
        for arm in ("sync", "fit") if cond == "time_policies_d25" else ("sync",):
            if arm not in arms and arm in main:  # (b), (c): against the main arms
                arms[arm] = {s: measures(c) for s, c in main[arm].items()}
        budgets = BUDGETS_H if cond == "time_policies" else (0.05,)
        out += [f"### `{cond}`: {what}", "", *table(arms), "", *comparisons(arms, budgets), ""]
        out += [f"![{cond}](img/{cond}.png)", f"![{cond} energy](img/{cond}_energy.png)", ""]
    out.append(END)
    return "\n".join(out)


def figures(data: dict[str, dict[str, dict[int, pl.DataFrame]]], img: Path) -> None:
    for cond, arms in data.items():
        runs = {
            arm: [c.rename({k: v for k, v in RENAMES.items() if k in c.columns}).sort("round")
                  for _, c in sorted(seeds.items())]
            for arm, seeds in arms.items()
        }  # fmt: skip
        plot_accuracy_vs_gib_and_sim_time(
            runs, img / f"{cond}.png", title=f"{cond}: {CONDITIONS[cond]}"
        )
        plot_accuracy_vs_energy(runs, img / f"{cond}_energy.png", title=f"{cond}: radio energy")


def main() -> int:
    return page_block.run(
        __doc__ or "", load=load, block=block, figures=figures, data=DATA, page=PAGE, img=IMG,
        begin=BEGIN, end=END,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
