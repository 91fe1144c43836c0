"""The MLflow UI itself, in a headless Chromium: ``fedcomm ui`` starts it (``mlflow ui --app-name
fedcomm``) on a tiny run's store and prints the link to the experiment's saved view "fedcomm:
accuracy vs traffic". The link opens on the runs table, in the model-training layout, with the
headline columns and the Dataset column (``digits / dirichlet 8`` and the partition hash's first
12 characters, context ``Training``); its chart view starts with accuracy against
``comm/cum_gib``. A run opened by the runs table's own link (no ``workflowType`` in it) is a
model-training run page whose "Model metrics" tab starts with accuracy against cumulative KiB.

Needs Chromium (Debian: ``apt-get install -y chromium``): skipped without it, except under
``CI=1``, where its absence fails the test. Each page is loaded in a fresh browser profile, as a
new user would see it (the UI remembers its GenAI / Model training switch per browser)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from html.parser import HTMLParser
from pathlib import Path

import pytest
from mlflow import MlflowClient

from fedcomm.config import Params
from fedcomm.stages.evaluate import evaluate_stage
from fedcomm.stages.partition import partition_stage
from fedcomm.stages.train import train_stage
from fedcomm.tracking.inputs import DIGEST_CHARS
from fedcomm.tracking.views import ACCURACIES, view_page
from tests.conftest import tiny_params
from tests.pipeline.servers import free_port

pytestmark = pytest.mark.slow

BROWSERS = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome")


@pytest.fixture(scope="module")
def browser() -> str:
    for name in BROWSERS:
        found = shutil.which(name)
        if found:
            return found
    message = f"no headless browser ({', '.join(BROWSERS)}); apt-get install -y chromium"
    if os.environ.get("CI"):
        pytest.fail(message)  # CI installs Chromium: the UI check must run there
    pytest.skip(message)


class _Text(HTMLParser):
    """The visible text of a page, one string per text node (scripts and styles left out), and
    the runs table's column headers: ``(position, column id)``, the position in its part (the
    columns pinned to the left are one part, the others another)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self.headers: list[tuple[int, str]] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._skip += tag in ("script", "style")
        a = dict(attrs)
        if "ag-header-cell " in f"{a.get('class')} " and a.get("col-id") and a.get("aria-colindex"):
            self.headers.append((int(a["aria-colindex"] or 0), a["col-id"] or ""))

    def handle_endtag(self, tag: str) -> None:
        self._skip -= tag in ("script", "style") and self._skip > 0

    def handle_data(self, data: str) -> None:
        if not self._skip and data.strip():
            self.parts.append(" ".join(data.split()))


@contextmanager
def fedcomm_ui(root: Path, log: Path) -> Iterator[tuple[str, list[str]]]:
    """``fedcomm ui`` on the project ``root``'s store, a free port; yields the UI's URL and the
    lines fedcomm printed, and stops it (SIGTERM: it stops its ``mlflow ui``)."""
    env = {**os.environ, "FEDCOMM_PROJECT_ROOT": str(root)}
    env.pop("MLFLOW_TRACKING_URI", None)
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fedcomm.cli", "ui", "--port", str(port)],
            cwd=root,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"fedcomm ui did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        printed = [line for line in log.read_text().splitlines() if line.startswith(("M", " "))]
        yield f"http://127.0.0.1:{port}", printed
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


def _page(browser: str, url: str, profile: Path) -> tuple[_Text, str]:
    """The text of ``url`` once the UI has rendered it (Chromium's DOM after its scripts ran,
    charts drawn), and that DOM."""
    out = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # as root in a CI container
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--window-size=1600,1000",
            "--run-all-compositor-stages-before-draw",  # lays the page out: the charts draw
            "--virtual-time-budget=30000",  # ms of page time (network waits do not count)
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    parser = _Text()
    parser.feed(out.stdout)
    return parser, out.stdout


def _after(text: list[str], first: str, *then: str) -> list[str]:
    """``text`` from ``first`` on; each of ``then`` must follow in that order."""
    assert first in text, (first, text)
    rest = text[text.index(first) :]
    at = 0
    for item in then:
        assert item in rest[at:], (item, rest)
        at = rest.index(item, at)
    return rest


def _numbers(parts: list[str]) -> list[float]:
    """The numbers among ``parts`` (a chart's tick labels)."""
    found = []
    for part in parts:
        with suppress(ValueError):
            found.append(float(part.replace(",", "")))
    return found


def test_the_ui_opens_the_view_and_runs_with_accuracy_against_traffic(
    browser: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDCOMM_PROJECT_ROOT", str(root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = Params.model_validate(tiny_params(**{"train.rounds": 2}))
    partition_stage(params)
    train_stage(params, "fedavg", 0, show_progress=False)
    evaluate_stage(params, "fedavg", 0)
    phash = json.loads((root / "data" / "partition" / "manifest.json").read_text())["hash"]
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tests")
    assert exp is not None
    (run,) = client.search_runs([exp.experiment_id])
    kib = run.data.metrics["comm/cum_bytes"] / 1024  # the run's traffic, up + down

    with fedcomm_ui(root, tmp_path / "ui.log") as (base, lines):
        link = view_page(base, exp.experiment_id)
        assert lines[:2] == [f"MLflow UI: {base} (Ctrl-C stops it)", f"  tests: {link}"], lines
        table, dom = _page(browser, link, tmp_path / "p1")
        # the table's link to the run, as a click follows it (no workflowType: the browser's)
        run_link = f"#/experiments/{exp.experiment_id}/runs/{run.info.run_id}"
        assert f'href="{run_link}"' in dom, dom
        overview, dom = _page(browser, f"{base}/{run_link}", tmp_path / "p2")
        tab = f"{run_link}/model-metrics"  # its "Model metrics" tab
        assert f'href="{tab}"' in dom, dom
        charts, _ = _page(browser, f"{base}/{tab}", tmp_path / "p3")
        chart_view = view_page(base, exp.experiment_id, charts=True)  # the chart button's page
        compare, _ = _page(browser, chart_view, tmp_path / "p4")

    # the saved view's runs table, model training's side bar, the headline columns first
    text = table.parts
    assert "fedcomm: accuracy vs traffic" in text and "fedavg-s0" in text, text
    assert "Overview" not in text and "Model registry" in text, text
    assert "attributes.`Run Name`" in {col for _, col in table.headers}  # pinned to the left
    columns = [col for _, col in sorted(table.headers) if col.startswith(("metrics.", "tags."))]
    headline = ["metrics.`final_acc`", "metrics.`final_local_acc`", "metrics.`up_gib`"]
    assert columns[:4] == ["tags.`algorithm`", *headline], columns  # first after the pinned
    assert str(run.data.metrics["final_acc"]) in text and "fedavg" in text, text
    cell = f"digits / dirichlet 8 ({phash[:DIGEST_CHARS]})"
    assert "Dataset" in text and cell in text, text  # the Dataset column
    assert text[text.index(cell) + 1] == "training", text  # its context tag (shown capitalised)
    # the run page in model training's layout (GenAI's: Evaluations, Judges)
    page = overview.parts
    assert "Judges" not in page and "Evaluations" not in page, page
    _after(page, "Model registry", "Runs", "fedavg-s0", "Model metrics")
    # its charts: accuracy against cumulative KiB first, drawn up to the run's traffic
    page = charts.parts
    legend = "fedavg-s0 (accuracy_vs_KiB/global)"
    chart = _after(page, "accuracy_vs_KiB", "global", "Step", legend)
    assert page.index("accuracy_vs_KiB") < page.index("comm"), page  # the first section
    ticks = _numbers(chart[: chart.index("Step")])
    assert max(ticks) >= kib / 2 > params.train.rounds, (ticks, kib)  # KiB, not rounds
    # the view's charts: accuracy against comm/cum_gib first, no empty simulated-time chart
    page = compare.parts
    _after(page, "accuracy vs traffic", "global/accuracy", "comm/cum_gib", "comm")
    assert "fedavg-s0 (global/accuracy)" in page, page
    drawn = sum(k in run.data.metrics for k in ACCURACIES)  # global, local, top-k
    section = page.index("accuracy vs traffic")
    assert page[section + 1] == f"({drawn})", page  # charts shown: not accuracy_vs_sim_s/global
