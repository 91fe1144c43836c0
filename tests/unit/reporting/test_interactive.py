"""The interactive curves page and ``dvc plots show``'s template (issue 42): self-contained HTML
(Vega inline, no script or stylesheet from the network), every run on it, and the mean ± standard
error over seeds checked against a hand computation. That the pages render in a browser with the
network off is ``tests/pipeline/test_offline_plots.py``."""

from __future__ import annotations

import json
import math
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import altair as alt
import polars as pl
import pytest
import vl_convert
from dvc_render.html import HTML

from fedcomm.reporting.interactive import experiment_page, seed_bands, write_pages
from fedcomm.reporting.plots import _PALETTE
from fedcomm.reporting.vega_page import (
    dvc_plots_template,
    vega_javascript,
    vegalite_version,
    versions,
)
from tests.conftest import REPO

# run "a": three seeds, evaluated at rounds 1 and 2; seed 2 also at round 3 (left out: not every
# seed has it). Its GiB differs by seed. Run "b": one seed.
ROWS = [
    ("a", 0, 1, 1.0, 0.20, 0.30, 600.0),
    ("a", 1, 1, 1.1, 0.30, 0.32, 1200.0),
    ("a", 2, 1, 1.2, 0.40, 0.34, 1800.0),
    ("a", 0, 2, 2.0, 0.50, 0.40, 3600.0),
    ("a", 1, 2, 2.2, 0.60, 0.42, 7200.0),
    ("a", 2, 2, 2.4, 0.80, 0.44, 10800.0),
    ("a", 2, 3, 3.6, 0.90, 0.46, 14400.0),
    ("b", 0, 1, 0.5, 0.10, 0.20, 900.0),
    ("b", 0, 2, 1.0, 0.15, 0.25, 1800.0),
]
COLUMNS = ["run", "seed", "round", "cum_gib", "global_accuracy", "local_accuracy", "sim_elapsed_s"]


def curves(*, sim: bool = False) -> pl.DataFrame:
    frame = pl.DataFrame(ROWS, schema=COLUMNS, orient="row")
    return frame if sim else frame.drop("sim_elapsed_s")


def test_seed_bands_by_hand() -> None:
    bands = seed_bands(curves(), "global_accuracy", "cum_gib")
    a = bands.filter(pl.col("run") == "a").sort("x")
    # round 1: 0.2, 0.3, 0.4 -> mean 0.3, sd 0.1, se 0.1/sqrt(3), at the mean GiB 1.1
    # round 2: 0.5, 0.6, 0.8 -> mean 0.6333, sd sqrt(((-.1333)^2 + (-.0333)^2 + .1667^2)/2)
    sd2 = math.sqrt(((0.5 - 1.9 / 3) ** 2 + (0.6 - 1.9 / 3) ** 2 + (0.8 - 1.9 / 3) ** 2) / 2)
    assert a["x"].to_list() == pytest.approx([1.1, 2.2])
    assert a["mean"].to_list() == pytest.approx([0.3, 1.9 / 3])
    assert a["se"].to_list() == pytest.approx([0.1 / math.sqrt(3), sd2 / math.sqrt(3)])
    assert a["seeds"].to_list() == [3, 3]  # round 3 (seed 2 only) left out
    b = bands.filter(pl.col("run") == "b")
    assert b["se"].to_list() == [0.0, 0.0] and b["mean"].to_list() == [0.10, 0.15]
    by_round = seed_bands(curves(), "global_accuracy", "round").filter(pl.col("run") == "a")
    assert by_round["x"].to_list() == [1.0, 2.0]
    assert by_round["se"].to_list() == pytest.approx(a["se"].to_list())


VOID = {"meta", "link", "img", "br", "hr", "input"}


class _Page(HTMLParser):
    """A page's scripts (attributes and text), its title, its src/href links and whether every
    element it opens is closed in order."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[tuple[dict[str, str | None], str]] = []
        self.links: list[str] = []
        self.title = ""
        self.open: list[str] = []
        self.misnested: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        self.links += [v for k, v in attrs if k in ("src", "href") and v]
        if tag == "script":
            self.scripts.append((found, ""))
        if tag not in VOID:
            self.open.append(tag)
        self._in = tag

    def handle_endtag(self, tag: str) -> None:
        if not self.open or self.open.pop() != tag:
            self.misnested.append(tag)
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "script":
            attrs, text = self.scripts[-1]
            self.scripts[-1] = (attrs, text + data)
        elif self._in == "title":
            self.title += data


def parse(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    assert not parser.open and not parser.misnested, (parser.open, parser.misnested)
    return parser


def specs(page: _Page) -> list[dict[str, Any]]:
    return [json.loads(t) for a, t in page.scripts if a.get("type") == "application/json"]


def rows(spec: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [r for r in spec["data"]["values"] if r["kind"] == kind]


def test_the_page_is_self_contained_and_shows_every_run() -> None:
    html = experiment_page(curves(), title="A <small> study")
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    page = parse(html)
    assert page.title == "A <small> study: curves"
    assert "<h1>A &lt;small&gt; study</h1>" in html
    assert not page.links  # no script, stylesheet or image from anywhere
    assert all("src" not in attrs for attrs, _ in page.scripts)
    bundle = max((t for _, t in page.scripts), key=len)
    assert "window.vegaEmbed" in bundle and len(bundle) > 300_000  # Vega, inline
    charts = specs(page)
    titles = [c["title"]["text"] for c in charts]
    assert titles == [
        "Global accuracy against communication",
        "Global accuracy against round",
        "Local accuracy against communication",
    ]  # no simulated time: no such chart
    for chart in charts:
        assert {r["run"] for r in rows(chart, "mean")} == {"a", "b"}
        assert chart["layer"][2]["encoding"]["color"]["scale"]["domain"] == ["a", "b"]
    gib = charts[0]
    assert gib["layer"][0]["encoding"]["x"]["title"].endswith("(GiB)")
    assert gib["layer"][2]["encoding"]["y"]["title"] == "global accuracy (%)"
    mean = [r for r in rows(gib, "mean") if r["run"] == "a"]
    assert [r["mean"] for r in mean] == pytest.approx([30.0, 100 * 1.9 / 3])  # percent
    assert mean[0]["se"] == pytest.approx(100 * 0.1 / math.sqrt(3))
    assert mean[0]["lo"] == pytest.approx(30.0 - 100 * 0.1 / math.sqrt(3))
    # each seed at its own GiB, every evaluated round (seed 2's round 3 too)
    seeds = [(r["seed"], r["x"]) for r in rows(gib, "seed") if r["run"] == "a"]
    assert sorted(seeds) == [(0, 1.0), (0, 2.0), (1, 1.1), (1, 2.2), (2, 1.2), (2, 2.4), (2, 3.6)]
    assert "a: 3 seeds, b: 1 seed" in gib["title"]["subtitle"]
    assert "standard error" in html and "mean cumulative GiB" in html  # the method, in words


def test_simulated_time_gets_its_chart_in_hours() -> None:
    page = parse(experiment_page(curves(sim=True), title="t", metric="global_accuracy"))
    charts = {c["title"]["text"]: c for c in specs(page)}
    sim = charts["Global accuracy against simulated time"]
    assert sim["layer"][0]["encoding"]["x"]["title"] == "simulated time (h)"
    assert max(r["x"] for r in rows(sim, "seed")) == pytest.approx(4.0)  # 14,400 s
    assert sim["layer"][2]["mark"]["interpolate"] == "step-after"


def test_metric_label_names_the_charts() -> None:
    frame = curves().rename({"global_accuracy": "topk_accuracy"})
    html = experiment_page(frame, title="t", metric="topk/accuracy", metric_label="top-3 accuracy")
    page = parse(html)
    titles = [c["title"]["text"] for c in specs(page)]
    assert titles[:2] == ["Top-3 accuracy against communication", "Top-3 accuracy against round"]


def test_dvc_template_carries_vega_and_no_cdn() -> None:
    template = dvc_plots_template("tiny")
    assert "{plot_divs}" in template and "{refresh_tag}" in template
    assert "{scripts}" not in template  # DVC would put its CDN <script src=...> tags there
    div = '<div id="p"><script>vegaEmbed("#p", {});</script></div>'
    page = HTML(template).with_scripts('<script src="https://cdn/vega"></script>')
    filled = page.with_element(div).embed()
    assert div in filled and "https://cdn" not in filled
    parsed = parse(filled)
    assert parsed.title == "tiny: dvc plots"
    assert all("src" not in attrs for attrs, _ in parsed.scripts)


def test_write_pages(tmp_path: Path) -> None:
    written = write_pages(tmp_path, curves(), title="t")
    assert [p.name for p in written] == ["interactive.html", "dvc_plots_template.html"]
    assert all(p.read_text().startswith("<!DOCTYPE html>") for p in written)


def test_dvc_plot_colours_are_the_png_plots() -> None:
    """pipeline/plots/by_run.json colours runs (sorted) as the PNG plots and the page do."""
    template = json.loads((REPO / "pipeline" / "plots" / "by_run.json").read_text())
    assert template["encoding"]["color"]["scale"]["range"] == list(_PALETTE)


def test_no_evaluations_is_a_page_that_says_so() -> None:
    html = experiment_page(curves().clear(), title="t")
    assert "No evaluated rounds to plot." in html and not specs(parse(html))


def test_the_bundle_is_the_vega_lite_altair_writes_for() -> None:
    assert alt.SCHEMA_VERSION.lstrip("v") in vega_javascript()  # "6.4.1": specs match the code
    assert vegalite_version() == alt.SCHEMA_VERSION.lstrip("v")
    assert f"Vega-Lite {vegalite_version()}," in versions()


def test_the_footer_names_the_vega_lite_bundled_when_altairs_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An Altair newer than vl-convert: the bundle is vl-convert's newest Vega-Lite, and the
    footer says so (not Altair's version, which the page does not carry)."""
    monkeypatch.setattr(alt, "SCHEMA_VERSION", "v99.1.0")
    known = vl_convert.get_vegalite_versions()
    newest = max(known, key=lambda v: tuple(int(p) for p in v.split(".")))
    assert vegalite_version() == newest
    assert f"Vega-Lite {newest}," in versions() and "99.1" not in versions()
