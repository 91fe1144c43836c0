"""Interactive plots with the network off (issue 42): a plain ``dvc plots show`` (the README's
command) and the summarize stage's ``reports/interactive.html``, on a tiny two-seed project,
opened in headless Chromium that can reach nothing (every host name unresolvable, a dead proxy,
a fresh profile). Every Vega view must have drawn its marks, the page must show no render error,
and ``dvc plots show`` must draw the declared views only (no automatic plot of every
``reports/curves.csv`` column). A control page with DVC's own template (Vega from a CDN) draws
nothing in the same browser: the network really is off.

Needs Chromium: skipped without it, except under ``CI=1`` (the ``browser`` fixture of
``tests/unit/tracking/test_mlflow_ui.py``). With ``FEDCOMM_SCREENSHOTS=<folder>`` the test also
saves its screenshots there (``dvc_plots_offline.png``, ``reports_interactive.png``; the
README's images in ``docs/img/``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml
from dvc_render.html import PAGE_HTML

from tests.conftest import REPO
from tests.pipeline._repo import build_repo, sh
from tests.unit.tracking.test_mlflow_ui import browser  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow

VIEWS = {"global_accuracy_vs_gib", "local_accuracy_vs_gib", "accuracy_vs_round"}  # dvc.yaml plots
PNGS = {"global_accuracy_vs_gib", "local_accuracy_vs_gib", "accuracy_vs_round"}  # reports/plots
OFFLINE = [
    "--headless",
    "--no-sandbox",  # as root in a CI container
    "--disable-gpu",
    "--host-resolver-rules=MAP * ~NOTFOUND",  # no host name resolves
    "--proxy-server=127.0.0.1:9",  # and whatever is not a name goes to a closed port
    "--disable-background-networking",
    "--window-size=1400,1060",  # the screenshots: the views and a first PNG
    "--virtual-time-budget=15000",  # ms of page time for the scripts to render
]


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    params = yaml.safe_load((REPO / "pipeline" / "profiles" / "tiny.yaml").read_text())
    params["experiment"]["seeds"] = [0, 1]  # standard-error bands
    params["experiment"]["runs"] = ["fedavg", "fedadam"]  # two runs are enough: 10 stages
    params["train"]["rounds"] = 5
    return build_repo(tmp_path_factory.mktemp("offline_plots"), yaml.safe_dump(params))


class _Rendered(HTMLParser):
    """Chromium's DOM after the scripts ran: the ids of the elements holding a drawn Vega view
    (an ``svg.marks`` or a ``canvas.marks`` inside them), the images and any render error."""

    VOID = frozenset({"meta", "link", "img", "br", "hr", "input", "source", "wbr"})

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str | None] = []  # the id of each open element (None without one)
        self.drawn: set[str] = set()
        self.images: list[str] = []
        self.errors = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag in ("svg", "canvas") and "marks" in (found.get("class") or "").split():
            self.drawn |= {i for i in self.stack if i}
        if tag == "img":
            self.images.append(found.get("src") or "")
        if "data-render-error" in found:
            self.errors += 1
        if tag not in self.VOID:
            self.stack.append(found.get("id"))

    def handle_endtag(self, tag: str) -> None:
        if tag not in self.VOID and self.stack:
            self.stack.pop()


def _chromium(chromium: str, page: Path, profile: Path, *args: str) -> str:
    """Offline Chromium on ``page`` in a fresh profile (no cache, nothing remembered)."""
    shutil.rmtree(profile, ignore_errors=True)
    cmd = [chromium, *OFFLINE, f"--user-data-dir={profile}", *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True).stdout


def render(chromium: str, page: Path, profile: Path, screenshot: Path | None = None) -> _Rendered:
    """``page`` as offline Chromium drew it; and a screenshot of it, when asked."""
    dom = _Rendered()
    dom.feed(_chromium(chromium, page, profile, "--dump-dom"))
    if screenshot:
        _chromium(chromium, page, profile, f"--screenshot={screenshot}")
        assert screenshot.read_bytes()[:4] == b"\x89PNG"
        folder = os.environ.get("FEDCOMM_SCREENSHOTS")
        if folder:
            shutil.copy(screenshot, Path(folder) / screenshot.name)
    return dom


def test_dvc_plots_show_draws_the_declared_views_offline(
    repo: Path,
    browser: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    printed = sh(repo, "dvc", "plots", "show")  # the README's command, .dvc/config's template
    page = repo / "dvc_plots" / "index.html"
    assert page.as_uri() in printed
    html = page.read_text()
    assert "<script src" not in html and "cdn.jsdelivr" not in html
    dom = render(browser, page, tmp_path / "profile", tmp_path / "dvc_plots_offline.png")
    assert dom.errors == 0
    assert dom.drawn == VIEWS  # each declared view drawn, and no automatic curves.csv plot
    shown = {Path(src).stem.removeprefix("workspace_reports_plots_") for src in dom.images}
    assert shown == PNGS  # the summarize stage's PNG plots, as images beside them
    assert all((page.parent / src).is_file() for src in dom.images)

    # control: DVC's own template loads Vega from a CDN, and offline it draws nothing
    cdn = tmp_path / "cdn_template.html"
    cdn.write_text(PAGE_HTML)
    sh(repo, "dvc", "plots", "show", "-o", "dvc_plots_cdn", "--html-template", str(cdn))
    control = render(browser, repo / "dvc_plots_cdn" / "index.html", tmp_path / "profile")
    assert "cdn.jsdelivr" in (repo / "dvc_plots_cdn" / "index.html").read_text()
    assert control.drawn == set()


def test_reports_page_draws_every_chart_offline(
    repo: Path,
    browser: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    page = repo / "reports" / "interactive.html"
    html = page.read_text()
    for run in ("fedavg", "fedadam"):
        assert f'"run": "{run}"' in html
    assert "<title>tiny profile: curves</title>" in html
    dom = render(browser, page, tmp_path / "profile", tmp_path / "reports_interactive.png")
    assert dom.errors == 0
    assert dom.drawn == {"chart-0", "chart-1", "chart-2"}  # GiB, round, local accuracy


def test_a_broken_page_says_so(browser: str, tmp_path: Path) -> None:  # noqa: F811
    """The notice the pages show when a view cannot render (not a blank page)."""
    from fedcomm.reporting.vega_page import dvc_plots_template

    page = tmp_path / "broken.html"
    div = '<div id="p"><script>vegaEmbed("#p", {"mark": "nonsense"});</script></div>'
    page.write_text(dvc_plots_template("broken").replace("{plot_divs}", div))
    dom = render(browser, page, tmp_path / "profile")
    assert dom.errors == 1 and dom.drawn == set()
