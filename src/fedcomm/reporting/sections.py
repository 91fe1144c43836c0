"""The markdown sections every summary shares: best accuracy within communication budgets and
upload caps, upload per client per round, and the rounds, GiB and time to reach targets; for
runs with a ``system`` section, their simulated clock and accuracy within simulated-time budgets,
and with ``system.energy`` the joules their clients spent.

Used by the summarize stage (:mod:`fedcomm.stages.summarize`) and by cross-experiment comparisons
(:mod:`fedcomm.reporting.compare`); both pass per-run lists of seed summaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedcomm.evaluation.seeds import aggregate_seeds
from fedcomm.reporting.verdict import Paired, shown_decimals, t_text


def _fmt(mean: Any, se: Any, pct: bool) -> str:
    """``mean ± se`` (percent with 2 decimals, or 4 significant digits); ``–`` when missing."""
    if mean is None:
        return "–"
    text = f"{100 * mean:.2f}" if pct else f"{mean:.4g}"
    if not se:
        return text
    return f"{text} ± {100 * se:.2f}" if pct else f"{text} ± {se:.2g}"


def upload_section(aggs: dict[str, dict[str, Any]]) -> str:
    """Upload per client per round (decimal KB), its save ratio against the ``fedavg`` run (if
    the experiment has one), the mean over rounds of the upload ratio against dense (the same
    content sent densely / what was sent), all traffic (both directions) and the uplink alone as
    shares of dense end-to-end FedAvg over ``train.rounds`` (ProgFed's cost ratio; its Table 5
    compares the uplink), and the local training time per round (LTTR)."""

    def mean(agg: dict[str, Any], *path: str) -> Any:
        node: Any = agg
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node.get("mean") if isinstance(node, dict) else None

    base = mean(aggs["fedavg"], "upload", "kb_per_client_round") if "fedavg" in aggs else None
    rows = [
        "| Run | Upload per client per round (KB) | Save ratio vs `fedavg` "
        "| Upload ratio vs dense (mean over rounds) | All traffic vs dense end-to-end "
        "| Upload vs dense end-to-end | LTTR (s) |"
    ]
    rows.append("|---|---:|---:|---:|---:|---:|---:|")
    for run, agg in aggs.items():
        kb = mean(agg, "upload", "kb_per_client_round")
        ratio = f"{base / kb:.2f}x" if base and kb else "–"
        dense = mean(agg, "upload", "up_ratio_mean")
        vs_dense = f"{dense:.2f}x" if dense else "–"
        costs = [mean(agg, "comm", k) for k in ("cost_vs_dense_e2e", "up_cost_vs_dense_e2e")]
        vs_e2e = " | ".join(f"{100 * c:.2f}%" if c is not None else "–" for c in costs)
        lttr = mean(agg, "time", "client_s_mean")
        rows.append(
            f"| `{run}` | {_fmt(kb, None, False)} | {ratio} | {vs_dense} | {vs_e2e} "
            f"| {_fmt(lttr, None, False)} |"
        )
    return "## Upload per client per round\n\n" + "\n".join(rows)


def best_within_table(
    aggs: dict[str, dict[str, Any]], section: str, unit: str = "GiB"
) -> str | None:
    """A markdown table of best global accuracy (%), rows = runs, columns = the limits found
    (in ``unit``) under ``section`` of the aggregated summaries (``at_budget``,
    ``at_upload_cap``, ``at_time_budget``); ``None`` when no run has any."""
    limits = sorted({k for a in aggs.values() for k in a.get(section, {})}, key=float)
    if not limits:
        return None
    rows = ["| Run | " + " | ".join(f"≤ {k} {unit}" for k in limits) + " |"]
    rows.append("|---|" + "---:|" * len(limits))
    for run, agg in aggs.items():
        cells = [agg.get(section, {}).get(k) or {} for k in limits]
        rows.append(
            f"| `{run}` | "
            + " | ".join(_fmt(c.get("mean"), c.get("se"), True) for c in cells)
            + " |"
        )
    return "\n".join(rows)


def budget_and_target_sections(
    summaries: dict[str, list[dict[str, Any]]], metric: str = "global accuracy"
) -> list[str]:
    """Markdown tables: best global accuracy within each GiB budget (up + down) and within each
    upload cap (FedDST's Tables 1-3: rows = runs, columns = caps); upload per client per round;
    round, GiB and time-to-accuracy (link model) to reach each target (seeds that never did are
    left out). ``metric`` names the accuracy they refer to (``evaluate.metric``)."""
    aggs = {run: aggregate_seeds(s) for run, s in summaries.items()}
    sections: list[str] = []
    budgets = best_within_table(aggs, "at_budget")
    if budgets:
        sections.append(f"## Best {metric} (%) within a communication budget\n\n" + budgets)
    caps = best_within_table(aggs, "at_upload_cap")
    if caps:
        sections.append(
            f"## Best {metric} (%) within an upload cap\n\n"
            "Best evaluation before the cumulative traffic of all clients passes the cap (GiB), "
            "counted as `evaluate.upload_cap_axis` says: upload + download (`up_down`, the "
            "default: the reading that reproduces FedDST's Table 1) or upload only (`up`).\n\n"
            + caps
        )
    sections.append(upload_section(aggs))
    simulated = any("sim" in a for a in aggs.values())
    if simulated:
        sections += sim_time_sections(aggs, summaries, metric)
    energy = any("energy" in a for a in aggs.values())
    if energy:
        sections.append(energy_section(aggs, summaries))
    targets = sorted({t for a in aggs.values() for t in a.get("to_target", {})}, key=float)
    if targets:
        sections.append(_targets_section(aggs, summaries, metric, targets, simulated, energy))
    return sections


def _targets_section(
    aggs: dict[str, dict[str, Any]],
    summaries: dict[str, list[dict[str, Any]]],
    metric: str,
    targets: list[str],
    simulated: bool,
    energy: bool = False,
) -> str:
    """Round, GiB, post-hoc time-to-accuracy and (runs with a ``system`` section) simulated
    hours to each target (with ``system.energy``: the clients' kJ); the seeds that never reached
    it are left out of the mean."""
    keys = ["round", "gib", "tta_s", *(["sim_h"] if simulated else [])]
    keys += ["energy_j"] if energy else []
    header = "| Run | Target | Seeds reaching | Round | GiB | Time-to-accuracy (s) |"
    header += " Simulated time (h) |" if simulated else ""
    rows = [
        header + (" Energy (kJ) |" if energy else ""),
        "|---|---:|---:|---:|---:|---:|" + "---:|" * (simulated + energy),
    ]
    for run, agg in aggs.items():
        for t in targets:
            node = agg.get("to_target", {}).get(t) or {}
            reached = (node.get("round") or {}).get("n", 0)
            vals = [
                _fmt(
                    _scaled((node.get(k) or {}).get("mean"), k),
                    _scaled((node.get(k) or {}).get("se"), k),
                    False,
                )
                for k in keys
            ]
            rows.append(
                f"| `{run}` | {float(t):.0%} | {reached}/{len(summaries[run])} | "
                + " | ".join(vals)
                + " |"
            )
    text = (
        "Mean ± standard error over the seeds that reached it; "
        "time-to-accuracy under the link model of `evaluate.link`."
    )
    if simulated:
        text = (
            "Mean ± standard error over the seeds that reached it. Two clocks: "
            "**Time-to-accuracy (s)** is the post-hoc model of `evaluate.link`, the special case "
            "of one uniform link for every client with no deadline, no availability and no "
            "simulated compute (each round: the slowest client's measured training time on this "
            "machine + the largest download and upload over the link + the server's time); "
            "**Simulated time (h)** is the run's own `system` clock (`time/sim_elapsed_s` after "
            "the first round that reached the target: each client's links, compute, "
            "availability and the round's deadline, as trained)."
        )
    if energy:
        text += (
            " **Energy (kJ)** is the joules all sampled clients had spent by then (`energy/cum_j`: "
            "their downloads, local work and uploads, dropped clients included)."
        )
    return f"## Reaching a target {metric}\n\n{text}\n\n" + "\n".join(rows)


def _scaled(value: Any, key: str) -> Any:
    """Joules shown in kJ; anything else as it is."""
    return value / 1e3 if key == "energy_j" and value is not None else value


_SIM_COLUMNS = (
    ("elapsed_h", "Simulated time (h)", False),
    ("round_s_mean", "Round, mean (s)", False),
    ("sampled", "Sampled / round", False),
    ("online", "Online / round", False),
    ("finished", "Finished / round", False),
    ("dropped", "Dropped / round", False),
    ("partial", "Partial / round", False),
    ("dropped_share", "Dropped (% of sampled)", True),
)


def _plain(value: float, digits: int = 3) -> str:
    """``digits`` significant digits, without an exponent from 0.001 to 10**6 (1500, 2.5,
    0.667), with one outside (3.63e-06)."""
    if value == 0:
        return "0"
    magnitude = math.floor(math.log10(abs(value)))
    if not -3 <= magnitude < 6:
        return f"{value:.{digits}g}"
    return f"{value:.{max(0, digits - 1 - magnitude)}f}"


def _sim_cell(node: Any, pct: bool) -> str:
    """``mean ± se`` of an aggregated leaf (``–`` when missing)."""
    node = node if isinstance(node, dict) else {}
    mean, se = node.get("mean"), node.get("se")
    if mean is None:
        return "–"
    if pct:
        return _fmt(mean, se, True)
    return f"{_plain(mean)} ± {_plain(se, 2)}" if se else _plain(mean)


def sim_time_sections(
    aggs: dict[str, dict[str, Any]],
    summaries: dict[str, list[dict[str, Any]]],
    metric: str = "global accuracy",
) -> list[str]:
    """The simulated clock of runs with a ``system`` section (simulated time): per run, simulated
    hours, mean simulated round and clients per round (mean ± SE over seeds), then the best
    ``metric`` within each simulated-time budget (``evaluate.time_budgets_h``). Runs without
    simulated time show ``–``."""
    rows = ["| Run | Seeds | " + " | ".join(h for _, h, _ in _SIM_COLUMNS) + " |"]
    rows.append("|---|---:|" + "---:|" * len(_SIM_COLUMNS))
    for run, agg in aggs.items():
        sim = agg.get("sim") or {}
        cells = [_sim_cell(sim.get(k), pct) for k, _, pct in _SIM_COLUMNS]
        rows.append(f"| `{run}` | {len(summaries[run])} | " + " | ".join(cells) + " |")
    out = [
        "## Simulated time\n\n"
        "The `system` section's clock (each client's download, compute and upload of the bits "
        "its codec encoded, its availability and the round's deadline): simulated hours of the "
        "whole run, the mean simulated round, and clients per round, mean ± standard error over "
        "seeds. Dropped = sampled clients whose update was not aggregated (a straggler past the "
        "deadline, or beyond the first K of an over-selected round); partial = aggregated after "
        "fewer local steps than configured.\n\n" + "\n".join(rows)
    ]
    budgets = best_within_table(aggs, "at_time_budget", "h")
    if budgets:
        out.append(
            f"## Best {metric} (%) within a simulated-time budget\n\n"
            "Best evaluation whose simulated elapsed time (`time/sim_elapsed_s`) is within the "
            "budget (hours, `evaluate.time_budgets_h`): the rule of the GiB budgets, on the "
            "simulated clock.\n\n" + budgets
        )
    return out


_ENERGY_COLUMNS = (  # key of a summary's `energy` node, header, scale (None: a percentage)
    ("total_j", "Energy (kJ)", 1e-3),
    ("round_j_mean", "Round, mean (J)", 1.0),
    ("down_j", "Download (kJ)", 1e-3),
    ("compute_j", "Compute (kJ)", 1e-3),
    ("up_j", "Upload (kJ)", 1e-3),
    ("dropped_share", "Spent by dropped (%)", None),
)


def energy_section(
    aggs: dict[str, dict[str, Any]], summaries: dict[str, list[dict[str, Any]]]
) -> str:
    """The joules the clients of runs with ``system.energy`` spent (mean ± SE over seeds): the
    whole run, per round, its download, compute and upload parts, and the share spent by
    clients that were dropped. Runs without show ``–``."""
    rows = ["| Run | Seeds | " + " | ".join(h for _, h, _ in _ENERGY_COLUMNS) + " |"]
    rows.append("|---|---:|" + "---:|" * len(_ENERGY_COLUMNS))
    for run, agg in aggs.items():
        node = agg.get("energy") or {}
        cells = []
        for key, _, scale in _ENERGY_COLUMNS:
            got = node.get(key)
            leaf: dict[str, Any] = got if isinstance(got, dict) else {}
            if scale is None:
                cells.append(_sim_cell(leaf, True))
                continue
            mean, se = leaf.get("mean"), leaf.get("se")
            shown = {"mean": None if mean is None else mean * scale, "se": se and se * scale}
            cells.append(_sim_cell(shown, False))
        rows.append(f"| `{run}` | {len(summaries[run])} | " + " | ".join(cells) + " |")
    return (
        "## Energy\n\n"
        "The joules the `system.energy` model charges the clients (docs/system.md, Energy): each "
        "sampled client's download and upload (J/bit and active power of its link's radio, "
        "then its tail) and local work (J/FLOP), dropped clients for what they did until the "
        "round closed; mean ± standard error over seeds.\n\n" + "\n".join(rows)
    )


@dataclass(frozen=True)
class PairedRow:
    """One ``summarize.paired`` comparison and its decision (:func:`~.verdict.paired`)."""

    a: str
    b: str
    metric: str
    scale: float
    result: Paired

    def as_dict(self, last_k: int) -> dict[str, Any]:
        """The numbers for ``reports/summary.json``."""
        return {
            "a": self.a,
            "b": self.b,
            "metric": self.metric,
            "scale": self.scale,
            "last_k": last_k,
            **self.result.as_dict(),
        }


def paired_section(rows: list[PairedRow], last_k: int) -> str:
    """The "Paired comparisons over seeds (decision rule)" section: per comparison n, the mean
    ± SE of d = a − b (shown units), t, df, the critical t and the verdict."""
    lines = [
        "| a | b | Metric | Claim | n | d = a − b, mean ± SE | t | df | Critical t | Verdict |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        p = row.result
        units = (
            " (points)" if row.scale == 100 else (f" (x{row.scale:g})" if row.scale != 1 else "")
        )
        claim = f"a − b {'>' if p.direction == 'greater' else '<'} {p.margin:g}{units}"
        d = "–"
        if p.mean is not None:
            places = shown_decimals(p.se, p.mean)
            d = f"{p.mean:+.{places}f}" + ("" if p.se is None else f" ± {p.se:.{places}f}")
        t = "–" if p.t is None else t_text(p.t)
        crit = "–" if p.t_crit is None else f"{p.t_crit:.3f}"
        df = "–" if p.df is None else str(p.df)
        lines.append(
            f"| `{row.a}` | `{row.b}` | {row.metric} | {claim} | {p.n} | {d} | {t} | {df} "
            f"| {crit} | **{p.verdict}** |"
        )
    return (
        "## Paired comparisons over seeds (decision rule)\n\n"
        f"Final = the mean of each seed's last {last_k} evaluations; d = a − b per seed (same "
        "seed: same partition and initialisation). Reproduced: n ≥ 3 and the one-sided t = "
        "(mean(d) − margin) / SE(d) beyond the critical t at n − 1 degrees of freedom (95%); in "
        "direction, not significant: the claimed sign, t short of it; not reproduced: the other "
        "sign.\n\n" + "\n".join(lines)
    )
