"""The shell of a self-contained Vega page: Vega, Vega-Lite and vega-embed inline, so
the page renders offline (a cluster node, a laptop on a train), and a plot that fails says so on
the page instead of staying blank.

The bundle comes from the installed ``vl-convert-python`` package (:func:`vega_javascript`, at the
Vega-Lite version of the installed Altair, kept in the cache dir), never from a CDN.
:func:`head` is a page's ``<head>`` contents (style, the error notice, the bundle),
:func:`chart` one chart's element and :func:`loader` the script that draws them;
:func:`dvc_plots_template` is the page template for ``dvc plots show`` (DVC's
``plots.html_template``): the same scripts around DVC's ``{plot_divs}``. The charts and the
experiment page are :mod:`fedcomm.reporting.interactive`.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
import json
import re
from functools import cache
from importlib.metadata import version
from pathlib import Path
from typing import Any

import altair as alt
import vl_convert

from fedcomm import atomic
from fedcomm.paths import cache_root

# Turns a script error or a failed vega-embed (a rejected promise) into a visible notice: a
# page whose plots cannot render must say so, not stay blank.
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
    ``javascript_bundle``, about 0.9 MB; no network at build or view time).

    Bundling takes vl-convert about 1.5 s, so the bundle is kept in the cache dir
    (``<cache dir>/vega/<key>.js``, :func:`fedcomm.paths.cache_root`), keyed by vl-convert's
    version, the Vega-Lite version and the globals line. Its first line holds the sha256 of the
    rest: a file that does not match is bundled and written again, never used. A cache dir that
    cannot be written only costs the bundling next time."""
    minor = ".".join(vegalite_version().split(".")[:2])
    blob = json.dumps([version("vl-convert-python"), minor, GLOBALS])
    path = cache_root() / "vega" / f"{hashlib.sha256(blob.encode()).hexdigest()[:32]}.js"
    bundle = _read_bundle(path)
    if bundle is None:
        bundle = vl_convert.javascript_bundle(GLOBALS, vl_version=minor)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(path, f"// sha256 {_digest(bundle)}\n{bundle}")
    return bundle


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _read_bundle(path: Path) -> str | None:
    """The cached bundle at ``path``, or None (absent, unreadable, or not what its digest says)."""
    try:
        head, _, bundle = path.read_text(encoding="utf-8").partition("\n")
    except (OSError, UnicodeDecodeError):
        return None
    return bundle if head == f"// sha256 {_digest(bundle)}" else None


def versions() -> str:
    """The bundled libraries' versions, for a page's footer."""
    return (
        f"Vega {vl_convert.get_vega_version()}, Vega-Lite {vegalite_version()}, "
        f"vega-embed {vl_convert.get_vega_embed_version()}"
    )


def script(code: str, **attrs: str) -> str:
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


def chart(spec: dict[str, Any], target: str) -> str:
    """A Vega-Lite ``spec`` drawn in a ``<div>`` of id ``target`` once :func:`loader` runs: the
    div and the spec as an inline JSON ``<script>`` naming it."""
    return f'<div class="chart" id="{target}"></div>\n' + script(
        _json(spec), type="application/json", class_="vega-spec", data_target=target
    )


def loader() -> str:
    """The script that draws every :func:`chart` of a page (after the last of them)."""
    return script(_LOADER, type="text/javascript")


def head(title: str) -> str:
    return "\n".join(
        [
            '<meta charset="utf-8">',
            f"<title>{html.escape(title)}</title>",
            f"<style>{_STYLE}</style>",
            script(_ERROR_NOTICE, type="text/javascript"),
            script(vega_javascript(), type="text/javascript"),
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
            head(heading),
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
