"""Interactive HTML pages of an experiment's curves that need no network.

- :func:`experiment_page`: an experiment's curves (the summarize stage's ``reports/curves``
  table) as one self-contained page: the evaluation metric against cumulative GiB, against the
  round and, for runs with simulated time (a ``system`` section), against simulated hours (with
  ``system.energy``, against the clients' cumulative energy too); local
  accuracy against GiB when measured. One colour per run (the PNG plots' colours); a line is the
  mean over seeds with a ±1 standard-error band, computed as the PNG plots compute it
  (:func:`~fedcomm.reporting.plots.seed_curve`: the seeds are aligned on the round, the point
  sits at the seeds' mean x; :func:`~fedcomm.reporting.plots.sim_time_curve` on the simulated
  clock), and thin lines are the single seeds at their own x.
- :func:`write_pages`: that page and ``dvc plots show``'s template
  (:func:`~fedcomm.reporting.vega_page.dvc_plots_template`) into ``reports/``.

Both carry Vega, Vega-Lite and vega-embed inline (:mod:`fedcomm.reporting.vega_page`, the pages'
shell), so they render offline.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import altair as alt
import polars as pl

from fedcomm import atomic
from fedcomm.config import CURVE_COLUMNS
from fedcomm.evaluation.sim_time import SIM_ELAPSED
from fedcomm.reporting.curves import curve_name
from fedcomm.reporting.plots import (
    CLOCKS,
    ENERGY_KJ,
    SIM_HOURS,
    Curve,
    algorithm_styles,
    clock_curve,
    metric_axis,
    seed_curve,
    wide_span,
)
from fedcomm.reporting.vega_page import chart, dvc_plots_template, head, loader, versions

SIM_COLUMN = CURVE_COLUMNS[SIM_ELAPSED]  # the curves table's simulated seconds
ENERGY_COLUMN = CURVE_COLUMNS[CLOCKS[ENERGY_KJ][0]]  # the curves table's joules so far
CLOCK_COLUMNS = {SIM_HOURS: SIM_COLUMN, ENERGY_KJ: ENERGY_COLUMN}  # a clock x: its curves column
GIB_TITLE = "cumulative communication, up + down (GiB)"
METHOD = (
    "Each thick line is a run's mean over its seeds with a shaded band of ±1 standard error "
    "(sample standard deviation over seeds / √n; no band with one seed). Against the round and "
    "against GiB the seeds are aligned on the round (only rounds every seed evaluated): the "
    "point sits at the seeds' mean cumulative GiB of that round, since GiB differs a little "
    "between seeds for some algorithms; each thin line is one seed at its own GiB.{sim} Hover "
    "a point for its numbers, click a legend entry to pick a run (shift-click for more), drag "
    "to pan and scroll to zoom (double-click resets)."
)
SIM_METHOD = (
    " Against simulated time the seeds are aligned on the simulated clock (at each time, each "
    "seed's latest evaluation, as a step)."
)
ENERGY_METHOD = " Against the clients' energy the seeds are aligned on their joules the same way."


def _per_seed(curves: pl.DataFrame, run: str, columns: Sequence[str]) -> list[pl.DataFrame]:
    """The rows of ``run`` as one table per seed (by seed), with ``columns``."""
    rows = curves.filter(pl.col("run") == run).select("seed", *columns)
    return [t.drop("seed") for _, t in rows.sort("seed").group_by("seed", maintain_order=True)]


def _has_values(curves: pl.DataFrame, column: str) -> bool:
    return column in curves.columns and curves[column].cast(pl.Float64).is_not_nan().any()


def seed_bands(curves: pl.DataFrame, metric: str, x: str) -> pl.DataFrame:
    """Each run's mean and standard error of ``metric`` over its seeds against ``x``.

    Args:
        curves: the long curves table (``run``, ``seed``, ``round`` and metric columns).
        metric: the y column.
        x: ``round``, ``cum_gib`` (seeds aligned on the round, the point at their mean x:
            :func:`~fedcomm.reporting.plots.seed_curve`), ``sim_hours`` or ``energy_kj`` (seeds
            aligned on the simulated clock or their clients' joules:
            :func:`~fedcomm.reporting.plots.clock_curve`).

    Returns:
        Columns ``run``, ``x``, ``mean``, ``se`` (0 with one seed), ``seeds`` in the metric's
        own units, runs sorted.
    """
    frames = []
    for run in sorted(set(curves["run"].to_list())):
        curve: Curve
        if x in CLOCKS:
            own = CLOCK_COLUMNS[x]
            tables = _per_seed(curves, run, [own, metric])
            curve = clock_curve([t.rename({own: CLOCKS[x][0]}) for t in tables], metric, x)
        else:
            tables = _per_seed(curves, run, list(dict.fromkeys(["round", x, metric])))
            curve = seed_curve(tables, metric, x)
        frames.append(
            pl.DataFrame(
                {"x": curve.x, "mean": curve.mean, "se": curve.se},
                schema={"x": pl.Float64, "mean": pl.Float64, "se": pl.Float64},
            ).select(pl.lit(run).alias("run"), pl.all(), pl.lit(curve.seeds).alias("seeds"))
        )
    empty = {"run": pl.String, "x": pl.Float64, "mean": pl.Float64, "se": pl.Float64}
    return pl.concat(frames) if frames else pl.DataFrame(schema={**empty, "seeds": pl.Int32})


def _chart_rows(curves: pl.DataFrame, metric: str, x: str, scale: float) -> list[dict[str, Any]]:
    """The data of one chart: ``kind: "mean"`` rows (:func:`seed_bands`, with ``lo``/``hi``)
    and ``kind: "seed"`` rows (each seed at its own x), y values times ``scale``."""
    bands = seed_bands(curves, metric, x).select(
        pl.lit("mean").alias("kind"),
        "run",
        "x",
        "seeds",
        pl.col("mean") * scale,
        pl.col("se") * scale,
        ((pl.col("mean") - pl.col("se")) * scale).alias("lo"),
        ((pl.col("mean") + pl.col("se")) * scale).alias("hi"),
    )
    own_x = pl.col(CLOCK_COLUMNS[x]) / CLOCKS[x][1] if x in CLOCKS else pl.col(x)
    seeds = (
        curves.select("run", "seed", own_x.cast(pl.Float64).alias("x"), pl.col(metric) * scale)
        .with_columns(pl.col(metric).cast(pl.Float64).fill_nan(None).alias("y"))
        .drop(metric)
        .drop_nulls()
        .sort("run", "seed", "x")
        .select(pl.lit("seed").alias("kind"), pl.all())
    )
    return [*bands.to_dicts(), *seeds.to_dicts()]


def _chart(
    rows: list[dict[str, Any]],
    *,
    title: str,
    subtitle: str,
    x_title: str,
    y_title: str,
    x_format: str,
    colours: dict[str, str],
    log_x: bool,
    steps: bool,
) -> dict[str, Any]:
    """One interactive Vega-Lite chart (a spec): band, seed lines, mean line with tooltips."""
    pick = alt.selection_point(fields=["run"], bind="legend")
    zoom = alt.selection_interval(bind="scales")
    shape: Literal["step-after", "linear"] = "step-after" if steps else "linear"
    x = alt.X(
        "x:Q",
        title=x_title,
        scale=alt.Scale(type="log") if log_x else alt.Scale(zero=False),
        axis=alt.Axis(format=x_format) if x_format else alt.Axis(),
    )
    colour = alt.Color(
        "run:N",
        title="run (click to pick)",
        scale=alt.Scale(domain=list(colours), range=list(colours.values())),
        legend=alt.Legend(symbolType="stroke", symbolStrokeWidth=3, symbolOpacity=1.0),
    )
    base = alt.Chart().encode(x=x, color=colour)
    means = alt.datum.kind == "mean"
    band = (
        base.transform_filter(means)
        .mark_area(interpolate=shape)
        .encode(
            y=alt.Y("lo:Q"),
            y2="hi:Q",
            opacity=alt.when(pick).then(alt.value(0.22)).otherwise(alt.value(0.04)),
        )
    )
    seed_lines = (
        base.transform_filter(alt.datum.kind == "seed")
        .mark_line(strokeWidth=0.8, interpolate=shape)
        .encode(
            y=alt.Y("y:Q"),
            detail="seed:N",
            opacity=alt.when(pick).then(alt.value(0.45)).otherwise(alt.value(0.05)),
        )
    )
    mean_line = (
        base.transform_filter(means)
        .mark_line(strokeWidth=2.2, interpolate=shape, point=alt.OverlayMarkDef(size=22))
        .encode(
            y=alt.Y("mean:Q", title=y_title, scale=alt.Scale(zero=False)),
            opacity=alt.when(pick).then(alt.value(1.0)).otherwise(alt.value(0.12)),
            tooltip=[
                alt.Tooltip("run:N"),
                alt.Tooltip("x:Q", title=x_title, format=x_format or ".4~g"),
                alt.Tooltip("mean:Q", title=f"{y_title}, mean", format=".2f"),
                alt.Tooltip("se:Q", title="± standard error", format=".2f"),
                alt.Tooltip("seeds:Q"),
            ],
        )
        .add_params(pick, zoom)
    )
    chart = alt.layer(band, seed_lines, mean_line, data=alt.Data(values=rows)).properties(
        title=alt.TitleParams(title, subtitle=subtitle, anchor="start"), width=480, height=300
    )
    return chart.to_dict()


def experiment_page(
    curves: pl.DataFrame,
    *,
    title: str,
    metric: str = "global/accuracy",
    metric_label: str | None = None,
) -> str:
    """An experiment's interactive curves page: a self-contained HTML document (Vega inline, no
    network needed) with the metric against cumulative GiB, against the round and, when any
    run has simulated time, against simulated hours, and local accuracy against GiB when
    measured; mean ± 1 SE over seeds per run (:func:`seed_bands`) and each seed's own line.

    Args:
        curves: the long curves table (the summarize stage's ``reports/curves.parquet``:
            ``run``, ``seed``, ``round``, ``cum_gib``, the metric, optionally
            ``local_accuracy`` and ``sim_elapsed_s``).
        title: the experiment's name, the page's title.
        metric: the y metric, as a rounds column (``global/accuracy``) or a curves column
            (``global_accuracy``); accuracies are shown in percent.
        metric_label: the metric in words (e.g. ``"top-3 accuracy"``); default from the name.

    Returns:
        The HTML document.
    """
    column = curve_name(metric)
    axis, scale = metric_axis(metric if "/" in metric else metric.replace("_", "/", 1))
    if metric_label is not None:
        axis = f"{metric_label} (%)" if scale == 100.0 else metric_label
    axis = axis[:1].lower() + axis[1:]  # an axis title: "global accuracy (%)"
    name = axis.removesuffix(" (%)")
    name = name[:1].upper() + name[1:]  # a chart title's: "Global accuracy", "Top-3 accuracy"
    runs = sorted(set(curves["run"].to_list()))
    colours = {run: colour for run, (colour, _) in algorithm_styles(runs).items()}
    counts = curves.group_by("run").agg(pl.col("seed").n_unique()).sort("run").rows()
    seeds = {n: f"{n} seed{'s' if n > 1 else ''}" for _, n in counts}
    subtitle = "mean ± 1 SE over " + (
        f"{next(iter(seeds.values()))} per run"
        if len(seeds) == 1
        else "seeds; " + ", ".join(f"{run}: {seeds[n]}" for run, n in counts)
    )
    sim = _has_values(curves, SIM_COLUMN)
    local = "local accuracy (%)"
    panels = [  # (x, y column, y title, y scale, chart title, x title, x format)
        ("cum_gib", column, axis, scale, f"{name} against communication", GIB_TITLE, ".3~g"),
        ("round", column, axis, scale, f"{name} against round", "round", "d"),
    ]
    if sim:
        hours = "simulated time (h)"
        panels.append((SIM_HOURS, column, axis, scale, f"{name} against {hours[:-4]}", hours, ""))
    energy = _has_values(curves, ENERGY_COLUMN)
    if energy:
        kj = "the clients' cumulative energy (kJ)"
        panels.append((ENERGY_KJ, column, axis, scale, f"{name} against {kj[:-5]}", kj, ""))
    if column != "local_accuracy":
        title_local = "Local accuracy against communication"
        panels.append(("cum_gib", "local_accuracy", local, 100.0, title_local, GIB_TITLE, ".3~g"))
    charts: list[str] = []
    for x, y, y_title, y_scale, chart_title, x_title, x_format in panels:
        if not _has_values(curves, y):
            continue
        rows = _chart_rows(curves, y, x, y_scale)
        xs = [r["x"] for r in rows if r["kind"] == "mean"]
        spec = _chart(
            rows,
            title=chart_title,
            subtitle=subtitle,
            x_title=x_title,
            y_title=y_title,
            x_format=x_format,
            colours=colours,
            log_x=x != "round" and wide_span(xs),  # as the PNG plots
            steps=x in CLOCKS,
        )
        charts.append(chart(spec, f"chart-{len(charts)}"))
    method = METHOD.format(sim=(SIM_METHOD if sim else "") + (ENERGY_METHOD if energy else ""))
    over = "rounds, communication and simulated time" if sim else "rounds and communication"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            head(f"{title}: curves"),
            "</head>",
            "<body>",
            f"<h1>{html.escape(title)}</h1>",
            f'<p class="note">{html.escape(name)} of each run over {over}. {method}</p>',
            '<div class="charts">',
            *(charts or ['<p class="note">No evaluated rounds to plot.</p>']),
            "</div>",
            loader(),
            f"<footer>{versions()}, inline: this page needs no network.</footer>",
            "</body>",
            "</html>",
        ]
    )


PAGE = "interactive.html"  # the experiment page in reports/
DVC_TEMPLATE = "dvc_plots_template.html"  # .dvc/config's plots.html_template (../reports/...)


def write_pages(
    reports: Path,
    curves: pl.DataFrame,
    *,
    title: str,
    metric: str = "global/accuracy",
    metric_label: str | None = None,
) -> list[Path]:
    """Write :func:`experiment_page` as ``reports/interactive.html`` and
    :func:`dvc_plots_template` as ``reports/dvc_plots_template.html`` (both atomically); their
    paths."""
    page = experiment_page(curves, title=title, metric=metric, metric_label=metric_label)
    written = [(reports / PAGE, page), (reports / DVC_TEMPLATE, dvc_plots_template(title))]
    for path, text in written:
        atomic.write_text(path, text)
    return [path for path, _ in written]
