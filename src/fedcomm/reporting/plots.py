"""Accuracy curves against communication (GiB), rounds, simulated time and the clients' energy, one
line per algorithm.

Seeds of an algorithm are aligned on ``round`` and drawn as their mean with a shaded ±1
standard-error band. Only rounds every seed evaluated are kept, so the mean never jumps where a
seed drops out (if the seeds share no round, every evaluated round is kept). Colours and markers
follow the sorted algorithm labels, so the same set of algorithms looks the same in every plot.
Against simulated time (runs with a ``system`` section) seeds are aligned on the simulated clock
instead (:func:`sim_time_curve`), and that panel sits beside the GiB one; against the clients'
cumulative energy (runs with ``system.energy``) likewise on their joules (:func:`energy_curve`).

Figures are built with :class:`matplotlib.figure.Figure` (no pyplot global state) and written
through a temporary file and an atomic rename.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from fedcomm.atomic import atomic_path
from fedcomm.evaluation.sim_time import HOUR_S, SIM_ELAPSED
from fedcomm.evaluation.sim_time import has_energy as run_has_energy
from fedcomm.evaluation.sim_time import has_sim_time as run_has_sim_time
from fedcomm.system.energy import CUM_J

GIB_COLUMN = "comm/cum_gib"
_PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#ff7f0e",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#17becf",
    "#bcbd22",
    "#7f7f7f",
)
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")  # 7 vs 10 colours: 70 distinct pairs
_LABELS = {
    "global/accuracy": "Global accuracy",
    "local/accuracy": "Local accuracy",
    "local/accuracy_weighted": "Weighted local accuracy",
    "topk/accuracy": "Top-k accuracy",
    "global/loss": "Global test loss",
    "train/loss": "Training loss",
}
_MARKER_SPACING = 0.1  # markers every 10% of the axes diagonal (even on log axes)


@dataclass(frozen=True)
class Curve:
    """One algorithm's seeds reduced to a mean curve.

    Attributes:
        x: x positions (mean over seeds), one per kept round.
        mean: mean metric over seeds.
        se: standard error over seeds (0 with a single seed).
        seeds: number of seeds.
    """

    x: list[float]
    mean: list[float]
    se: list[float]
    seeds: int


def algorithm_styles(labels: Sequence[str]) -> dict[str, tuple[str, str]]:
    """A (colour, marker) per label, assigned in sorted label order.

    Args:
        labels: algorithm labels.

    Returns:
        ``{label: (colour, marker)}``.
    """
    ordered = sorted(set(labels))
    return {
        label: (_PALETTE[i % len(_PALETTE)], _MARKERS[i % len(_MARKERS)])
        for i, label in enumerate(ordered)
    }


def metric_axis(metric: str) -> tuple[str, float]:
    """Axis label and scale for ``metric``: accuracies are shown in percent.

    Args:
        metric: a metric key such as ``"global/accuracy"``.

    Returns:
        ``(label, scale)``; plotted values are ``value * scale``.
    """
    name = _LABELS.get(metric, metric)
    if metric.endswith("accuracy") or metric.endswith("accuracy_weighted"):
        return f"{name} (%)", 100.0
    return name, 1.0


def seed_curve(tables: Sequence[pl.DataFrame], metric: str, x: str) -> Curve:
    """Align several seeds' rounds tables on ``round`` and reduce them to mean and SE.

    Args:
        tables: one rounds table per seed.
        metric: the y column.
        x: the x column (``"round"`` or ``"comm/cum_gib"``).

    Returns:
        The :class:`Curve` (empty when no seed measured ``metric``).
    """
    parts = [
        t.select(pl.col("round").cast(pl.Int32), pl.col(x).cast(pl.Float64).alias("_x"), metric)
        .with_columns(pl.col(metric).cast(pl.Float64).fill_nan(None))
        .drop_nulls()
        .with_columns(pl.lit(i).alias("_seed"))
        for i, t in enumerate(tables)
        if metric in t.columns and x in t.columns
    ]
    if not parts:
        return Curve([], [], [], len(tables))
    stats = (
        pl.concat(parts)
        .group_by("round")
        .agg(
            pl.col("_x").mean().alias("x"),
            pl.col(metric).mean().alias("mean"),
            (pl.col(metric).std(ddof=1) / pl.len().sqrt()).fill_null(0.0).alias("se"),
            pl.len().alias("count"),
        )
        .sort("round")
    )
    complete = stats.filter(pl.col("count") == len(parts))
    kept = complete if complete.height else stats
    return Curve(kept["x"].to_list(), kept["mean"].to_list(), kept["se"].to_list(), len(tables))


def _draw_curve(
    ax: Axes,
    curve: Curve,
    label: str,
    style: tuple[str, str],
    scale: float,
    *,
    steps: bool = False,
) -> None:
    """Draw a mean line (with sparse markers) and, for several seeds, its ±SE band; ``steps``:
    as a step function (each value holds until the next point)."""
    colour, marker = style
    mean = [m * scale for m in curve.mean]
    seeds = f"{curve.seeds} seeds" if curve.seeds > 1 else "1 seed"
    ax.plot(
        curve.x,
        mean,
        color=colour,
        marker=marker,
        markevery=_MARKER_SPACING,
        markersize=5,
        linewidth=1.8,
        label=f"{label} ({seeds})",
        drawstyle="steps-post" if steps else "default",
    )
    if curve.seeds > 1:
        low = [(m - s) * scale for m, s in zip(curve.mean, curve.se, strict=True)]
        high = [(m + s) * scale for m, s in zip(curve.mean, curve.se, strict=True)]
        ax.fill_between(
            curve.x,
            low,
            high,
            color=colour,
            alpha=0.18,
            linewidth=0,
            step="post" if steps else None,
        )


def wide_span(xs: Sequence[float]) -> bool:
    """True when the positive values of ``xs`` span more than two decades."""
    positive = [v for v in xs if v > 0]
    return bool(positive) and max(positive) / min(positive) > 100.0


def save_figure(fig: Figure, path: Path) -> None:
    """Write ``fig`` as a PNG to ``path`` through a temporary file and an atomic rename.

    Args:
        fig: the figure.
        path: destination; parent directories are created.
    """
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=150)


def _panel(
    ax: Axes,
    runs: Mapping[str, Sequence[pl.DataFrame]],
    *,
    metric: str,
    x: str,
    xlabel: str,
    title: str,
    legend: bool = True,
) -> bool:
    """One curve per algorithm against ``x`` on ``ax`` (colours by :func:`algorithm_styles`);
    True when anything was drawn. ``x`` a clock (:data:`CLOCKS`: ``SIM_HOURS``, ``ENERGY_KJ``)
    aligns the seeds on it (:func:`clock_curve`), any other ``x`` on the round
    (:func:`seed_curve`)."""
    ylabel, scale = metric_axis(metric)
    styles = algorithm_styles(list(runs))
    all_x: list[float] = []
    for label in sorted(runs):
        if x in CLOCKS:
            curve = clock_curve(runs[label], metric, x)
        else:
            curve = seed_curve(runs[label], metric, x)
        if curve.x:
            _draw_curve(ax, curve, label, styles[label], scale, steps=x in CLOCKS)
            all_x.extend(curve.x)
    if not all_x:
        ax.text(0.5, 0.5, f"no {metric} measured", ha="center", va="center", transform=ax.transAxes)
    elif (x == GIB_COLUMN or x in CLOCKS) and wide_span(all_x):
        ax.set_xscale("log")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    if all_x and legend:
        ax.legend(loc="best", fontsize="small", framealpha=0.9)
    return bool(all_x)


def _plot(
    runs: Mapping[str, Sequence[pl.DataFrame]],
    path: Path,
    *,
    metric: str,
    x: str,
    xlabel: str,
    title: str,
) -> None:
    """Shared body of the public plot functions: one curve per algorithm against ``x``."""
    fig = Figure(figsize=(7.5, 4.8), layout="tight")
    _panel(fig.subplots(), runs, metric=metric, x=x, xlabel=xlabel, title=title)
    save_figure(fig, path)


Runs = Mapping[str, Sequence[pl.DataFrame]]  # algorithm label -> rounds tables of its seeds
ACCURACY = "global/accuracy"


def plot_accuracy_vs_gib(
    runs: Runs, path: Path, *, metric: str = ACCURACY, title: str | None = None
) -> None:
    """Plot ``metric`` (the y column) against cumulative communication (``comm/cum_gib``, up +
    down) as a PNG at ``path``; ``title`` defaults to one naming the metric."""
    xlabel = "Cumulative communication, up + down (GiB)"
    _plot_against(runs, path, metric, title, GIB_COLUMN, xlabel, "communication")


def plot_accuracy_vs_round(
    runs: Runs, path: Path, *, metric: str = ACCURACY, title: str | None = None
) -> None:
    """Plot ``metric`` (the y column) against the communication round as a PNG at ``path``;
    ``title`` defaults to one naming the metric."""
    _plot_against(runs, path, metric, title, "round", "Round", "round")


SIM_HOURS = "sim_hours"  # the x of the simulated-time panel: SIM_ELAPSED / 3600
ENERGY_KJ = "energy_kj"  # the x of the energy panel: the clients' joules so far / 1000
CLOCKS = {SIM_HOURS: (SIM_ELAPSED, HOUR_S), ENERGY_KJ: (CUM_J, 1e3)}  # x: (column, its unit)


def has_sim_time(runs: Runs) -> bool:
    """True when any seed of any run has simulated elapsed time (a ``system`` section)."""
    return any(run_has_sim_time(t) for tables in runs.values() for t in tables)


def has_energy(runs: Runs) -> bool:
    """True when any seed of any run has the clients' joules (``system.energy``)."""
    return any(run_has_energy(t) for tables in runs.values() for t in tables)


def sim_time_curve(tables: Sequence[pl.DataFrame], metric: str) -> Curve:
    """Seeds aligned on the simulated clock (:func:`clock_curve`), ``x`` in simulated hours."""
    return clock_curve(tables, metric, SIM_HOURS)


def energy_curve(tables: Sequence[pl.DataFrame], metric: str) -> Curve:
    """Seeds aligned on their clients' cumulative energy (:func:`clock_curve`), ``x`` in kJ."""
    return clock_curve(tables, metric, ENERGY_KJ)


def clock_curve(tables: Sequence[pl.DataFrame], metric: str, x: str) -> Curve:
    """Seeds aligned on a clock that each seed runs at its own pace (:data:`CLOCKS`: the
    simulated time, the clients' cumulative energy), reduced to mean and SE of ``metric``.

    Seeds of one run reach a round at different simulated times (each draws its own clients'
    links, compute and availability), so they are not averaged by round: at every time ``t`` at
    which some seed evaluated, each seed contributes its latest evaluation at or before ``t``
    (a step function: what that seed's model scored at time ``t``). Only times from the last
    seed's first evaluation to the first seed's last evaluation are kept, so every point
    averages every seed (one seed: all its evaluations); if the seeds share no such span, every
    time is kept and each point averages the seeds that had evaluated by then. Energy is
    aligned the same way.

    Args:
        tables: one rounds table per seed (``round``, the clock's column and ``metric``).
        metric: the y column.
        x: ``SIM_HOURS`` (``time/sim_elapsed_s``) or ``ENERGY_KJ`` (``energy/cum_j``).

    Returns:
        The :class:`Curve` with ``x`` in the clock's unit (simulated hours, kJ; empty when no
        seed has both columns).
    """
    column, unit = CLOCKS[x]
    parts = [
        t.select(
            (pl.col(column).cast(pl.Float64) / unit).alias("t"),
            pl.col(metric).cast(pl.Float64).fill_nan(None).alias("y"),
        )
        .drop_nulls()
        .sort("t")
        for t in tables
        if metric in t.columns and column in t.columns
    ]
    parts = [p for p in parts if p.height]
    if not parts:
        return Curve([], [], [], len(tables))
    start = max(float(p["t"][0]) for p in parts)
    stop = min(float(p["t"][-1]) for p in parts)
    every = pl.DataFrame({"t": sorted({v for p in parts for v in p["t"].to_list()})})
    grid = every.filter((pl.col("t") >= start) & (pl.col("t") <= stop))
    if not grid.height:  # the seeds' evaluations never overlap in time: keep every time
        grid = every
    steps = [
        grid.join_asof(
            p.unique("t", keep="last", maintain_order=True), on="t", strategy="backward"
        )["y"]
        for p in parts
    ]
    stacked = pl.DataFrame({f"s{i}": s for i, s in enumerate(steps)})
    cols = [pl.col(c) for c in stacked.columns]
    stats = stacked.select(
        pl.mean_horizontal(cols).alias("mean"),
        pl.concat_list(cols).list.drop_nulls().list.std(ddof=1).fill_null(0.0).alias("std"),
        pl.sum_horizontal(c.is_not_null() for c in cols).alias("n"),
    )
    se = [
        s / n**0.5 if n > 1 else 0.0
        for s, n in zip(stats["std"].to_list(), stats["n"].to_list(), strict=True)
    ]
    return Curve(grid["t"].to_list(), stats["mean"].to_list(), se, len(tables))


def plot_accuracy_vs_gib_and_sim_time(
    runs: Runs, path: Path, *, metric: str = ACCURACY, title: str | None = None
) -> None:
    """Two panels side by side, same runs, same colours: ``metric`` against cumulative GiB (up +
    down) and against simulated hours (:func:`sim_time_curve`), with ±1 SE bands over seeds; a
    PNG at ``path``. For runs with a ``system`` section (simulated time)."""
    name = metric_axis(metric)[0].removesuffix(" (%)")
    fig = Figure(figsize=(13.0, 4.8), layout="constrained")
    left, right = fig.subplots(1, 2, sharey=True)
    _panel(
        left,
        runs,
        metric=metric,
        x=GIB_COLUMN,
        xlabel="Cumulative communication, up + down (GiB)",
        title="against bytes",
    )
    _panel(
        right,
        runs,
        metric=metric,
        x=SIM_HOURS,
        xlabel="Simulated time (h): links, compute, availability, deadline",
        title="against simulated time (each seed's latest evaluation)",
        legend=False,
    )
    right.set_ylabel("")
    fig.suptitle(title or f"{name}: communication and simulated time")
    save_figure(fig, path)


def plot_accuracy_vs_energy(
    runs: Runs, path: Path, *, metric: str = ACCURACY, title: str | None = None
) -> None:
    """``metric`` against the clients' cumulative energy (kJ: every sampled client's download,
    local work and upload, :func:`energy_curve`), with ±1 SE bands over seeds; a PNG at
    ``path``. For runs with ``system.energy``."""
    name = metric_axis(metric)[0].removesuffix(" (%)")
    _plot(
        runs,
        path,
        metric=metric,
        x=ENERGY_KJ,
        xlabel="Cumulative client energy (kJ): radios and local work, dropped clients included",
        title=title or f"{name} vs the clients' energy (each seed's latest evaluation)",
    )


def _plot_against(
    runs: Runs, path: Path, metric: str, title: str | None, x: str, xlabel: str, against: str
) -> None:
    name = metric_axis(metric)[0].removesuffix(" (%)")
    title = title or f"{name} vs {against}"
    _plot(runs, path, metric=metric, x=x, xlabel=xlabel, title=title)
