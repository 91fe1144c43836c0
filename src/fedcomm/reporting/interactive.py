"""Interactive HTML pages of an experiment's curves that need no network (issue 42).

Both pages carry Vega, Vega-Lite and vega-embed inline: the bundle comes from the installed
``vl-convert-python`` package (:func:`vega_javascript`, at the Vega-Lite version of the installed
Altair), never from a CDN, so they render offline (a cluster node, a laptop on a train) and a
plot that fails says so on the page instead of staying blank.

- :func:`experiment_page`: an experiment's curves (the summarize stage's ``reports/curves``
  table) as one self-contained page: the evaluation metric against cumulative GiB, against the
  round and, for runs with simulated time (a ``system`` section), against simulated hours; local
  accuracy against GiB when measured. One colour per run (the PNG plots' colours); a line is the
  mean over seeds with a ±1 standard-error band, computed as the PNG plots compute it
  (:func:`~fedcomm.reporting.plots.seed_curve`: the seeds are aligned on the round, the point
  sits at the seeds' mean x; :func:`~fedcomm.reporting.plots.sim_time_curve` on the simulated
  clock), and thin lines are the single seeds at their own x.
- :func:`dvc_plots_template`: the page template for ``dvc plots show`` (DVC's
  ``plots.html_template``), the same scripts around DVC's ``{plot_divs}``.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any, Literal

import altair as alt
import polars as pl
import vl_convert

from fedcomm import atomic
from fedcomm.config import CURVE_COLUMNS
from fedcomm.evaluation.sim_time import HOUR_S, SIM_ELAPSED
from fedcomm.reporting.curves import curve_name
from fedcomm.reporting.plots import Curve, algorithm_styles, metric_axis, seed_curve, sim_time_curve

SIM_COLUMN = CURVE_COLUMNS[SIM_ELAPSED]  # the curves table's simulated seconds
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
# Turns a script error or a failed vega-embed (a rejected promise) into a visible notice: a
# page whose plots cannot render must say so, not stay blank (issue 42).
_ERROR_NOTICE = """
(function () {
  function notice(message) {
    var box = document.createElement("pre");
    box.dataset.renderError = "1";
    box.style.cssText = "color:#b00020;border:1px solid #b00020;padding:8px;white-space:pre-wrap";
    box.textContent = "A plot failed to render: " + message;
    (document.body || document.documentElement).prepend(box);
  }
  window.addEventListener("error", function (e) { notice(e.message); });
  window.addEventListener("unhandledrejection", function (e) {
    notice(e.reason && e.reason.message ? e.reason.message : String(e.reason));
  });
  window.addEventListener("DOMContentLoaded", function () {
    if (typeof window.vegaEmbed !== "function") notice("vega-embed did not load");
  });
})();
"""
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 24px; color: #222; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
p.note { max-width: 75em; color: #444; line-height: 1.4; }
.charts { display: flex; flex-wrap: wrap; gap: 28px; }
footer { margin-top: 2em; color: #777; font-size: 0.85em; }
"""
_LOADER = """
document.querySelectorAll("script.vega-spec").forEach(function (node) {
  vegaEmbed("#" + node.dataset.target, JSON.parse(node.textContent), {actions: false});
});
"""


GLOBALS = "window.vegaEmbed = vegaEmbed; window.vega = vega; window.vegaLite = vegaLite;"


def vegalite_version() -> str:
    """The Vega-Lite version the bundle carries: the installed Altair's (``"6.4.1"``) when
    vl-convert has its minor version, else vl-convert's newest (``"6.4"``: vl-convert names
    minor versions only)."""
    wanted = alt.SCHEMA_VERSION.lstrip("v")  # "v6.4.1" -> "6.4.1"
    known = vl_convert.get_vegalite_versions()
    if ".".join(wanted.split(".")[:2]) in known:
        return wanted
    return max(known, key=lambda v: tuple(int(p) for p in v.split(".")))


@cache
def vega_javascript() -> str:
    """Vega, Vega-Lite (:func:`vegalite_version`) and vega-embed as one JavaScript bundle that
    defines ``vegaEmbed``, ``vega`` and ``vegaLite`` globally (vl-convert's
    ``javascript_bundle``, about 0.9 MB; no network at build or view time)."""
    minor = ".".join(vegalite_version().split(".")[:2])
    return vl_convert.javascript_bundle(GLOBALS, vl_version=minor)


def versions() -> str:
    """The bundled libraries' versions, for a page's footer."""
    return (
        f"Vega {vl_convert.get_vega_version()}, Vega-Lite {vegalite_version()}, "
        f"vega-embed {vl_convert.get_vega_embed_version()}"
    )


def _script(code: str, **attrs: str) -> str:
    """``code`` as an inline ``<script>`` element (a ``</script`` inside it, which would end the
    element early, escaped as ``<\\/script``: the same text in a JS string or regex)."""
    extra = "".join(
        f' {k.rstrip("_").replace("_", "-")}="{html.escape(v)}"' for k, v in attrs.items()
    )
    safe = re.sub("</(?=script)", r"<\\/", code, flags=re.IGNORECASE)
    return f"<script{extra}>\n{safe}\n</script>"


def _json(value: Any) -> str:
    """``value`` as JSON safe inside a ``<script>`` element (every ``<`` as ``\\u003c``)."""
    return json.dumps(value).replace("<", "\\u003c")


def _head(title: str) -> str:
    return "\n".join(
        [
            '<meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{_STYLE}</style>",
            _script(_ERROR_NOTICE, type="text/javascript"),
            _script(vega_javascript(), type="text/javascript"),
        ]
    )


def dvc_plots_template(title: str) -> str:
    """The HTML template for ``dvc plots show`` (DVC's ``plots.html_template``): the page title
    names the experiment and Vega comes inline (:func:`vega_javascript`).

    It has DVC's ``{plot_divs}`` and ``{refresh_tag}`` placeholders but not its scripts one: DVC
    fills that with ``<script src=...>`` tags for a CDN's (older) Vega, which would block the
    page offline and replace the inline libraries online. Only Vega plots and images need no
    scripts of their own (plotly plots would; this project declares none)."""
    heading = f"{title}: dvc plots"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            "<html>",
            "<head>",
            "{refresh_tag}",
            _head(heading),
            "<style>table { border-spacing: 15px; } .plots img { max-width: 620px; }</style>",
            "</head>",
            "<body>",
            f"<h1>{html.escape(heading)}</h1>",
            '<p class="note">Every seed of every run as DVC reads <code>reports/curves.csv</code>'
            " (one colour per run; hover for values, click a legend entry to pick a run). The "
            "mean ± standard-error view is <code>reports/interactive.html</code>.</p>",
            '<div class="charts plots">',  # side by side, PNG plots at a readable size
            "{plot_divs}",
            "</div>",
            f"<footer>{versions()}, inline: the page needs no network.</footer>",
            "</body>",
            "</html>",
        ]
    )


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
            :func:`~fedcomm.reporting.plots.seed_curve`) or ``sim_hours`` (seeds aligned on the
            simulated clock: :func:`~fedcomm.reporting.plots.sim_time_curve`).

    Returns:
        Columns ``run``, ``x``, ``mean``, ``se`` (0 with one seed), ``seeds`` in the metric's
        own units, runs sorted.
    """
    frames = []
    for run in sorted(set(curves["run"].to_list())):
        curve: Curve
        if x == "sim_hours":
            tables = _per_seed(curves, run, [SIM_COLUMN, metric])
            curve = sim_time_curve([t.rename({SIM_COLUMN: SIM_ELAPSED}) for t in tables], metric)
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
    own_x = pl.col(SIM_COLUMN) / HOUR_S if x == "sim_hours" else pl.col(x)
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
    runs = sorted(set(curves["run"].to_list())) if "run" in curves.columns else []
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
        panels.append(("sim_hours", column, axis, scale, f"{name} against {hours[:-4]}", hours, ""))
    if column != "local_accuracy":
        title_local = "Local accuracy against communication"
        panels.append(("cum_gib", "local_accuracy", local, 100.0, title_local, GIB_TITLE, ".3~g"))
    charts: list[str] = []
    for x, y, y_title, y_scale, chart_title, x_title, x_format in panels:
        if not _has_values(curves, y):
            continue
        rows = _chart_rows(curves, y, x, y_scale)
        xs = [r["x"] for r in rows if r["kind"] == "mean" and r["x"] > 0]  # as the PNG plots
        spec = _chart(
            rows,
            title=chart_title,
            subtitle=subtitle,
            x_title=x_title,
            y_title=y_title,
            x_format=x_format,
            colours=colours,
            log_x=x != "round" and bool(xs) and max(xs) / min(xs) > 100.0,  # over two decades
            steps=x == "sim_hours",
        )
        target = f"chart-{len(charts)}"
        charts.append(
            f'<div class="chart" id="{target}"></div>\n'
            + _script(_json(spec), type="application/json", class_="vega-spec", data_target=target)
        )
    method = METHOD.format(sim=SIM_METHOD if sim else "")
    over = "rounds, communication and simulated time" if sim else "rounds and communication"
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            _head(f"{title}: curves"),
            "</head>",
            "<body>",
            f"<h1>{html.escape(title)}</h1>",
            f'<p class="note">{html.escape(name)} of each run over {over}. {method}</p>',
            '<div class="charts">',
            *(charts or ['<p class="note">No evaluated rounds to plot.</p>']),
            "</div>",
            _script(_LOADER, type="text/javascript"),
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
