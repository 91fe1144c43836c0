"""The MLflow UI itself, in a headless Chromium: ``fedcomm ui`` starts it on a tiny run's store
and prints the link to the experiment's runs; the link opens on the runs table, whose Dataset
column names the partition (``digits / dirichlet 8`` and the partition hash's first 12
characters, context ``Training``).

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
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path

import pytest
from mlflow import MlflowClient

from fedcomm.config import Params
from fedcomm.stages.partition import partition_stage
from fedcomm.stages.train import train_stage
from fedcomm.tracking import mlflow as tracking
from fedcomm.tracking.inputs import DIGEST_CHARS
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
    """The visible text of a page, one string per text node (scripts and styles left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self._skip += tag in ("script", "style")

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


def _page_text(browser: str, url: str, profile: Path) -> list[str]:
    """The text of ``url`` once the UI has rendered it (Chromium's DOM after its scripts ran)."""
    out = subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",  # as root in a CI container
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--window-size=1600,1000",
            "--virtual-time-budget=20000",  # ms of page time (network waits do not count)
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
    return parser.parts


def test_the_ui_opens_on_the_runs_and_names_the_partition(
    browser: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "project"
    root.mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDCOMM_PROJECT_ROOT", str(root))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    params = Params.model_validate(tiny_params(**{"train.rounds": 1}))
    partition_stage(params)
    train_stage(params, "fedavg", 0, show_progress=False)
    phash = json.loads((root / "data" / "partition" / "manifest.json").read_text())["hash"]
    exp = MlflowClient(f"sqlite:///{root / 'mlflow.db'}").get_experiment_by_name("tests")
    assert exp is not None

    with fedcomm_ui(root, tmp_path / "ui.log") as (base, lines):
        link = tracking.runs_page(base, exp.experiment_id)
        assert lines[:2] == [f"MLflow UI: {base} (Ctrl-C stops it)", f"  tests: {link}"], lines
        text = _page_text(browser, link, tmp_path / "profile")

    assert "Runs" in text and "fedavg-s0" in text, text  # the runs table, with the run
    assert "Overview" not in text and "Traces" in text, text  # model training's side bar
    cell = f"digits / dirichlet 8 ({phash[:DIGEST_CHARS]})"
    assert "Dataset" in text and cell in text, text  # the Dataset column
    assert text[text.index(cell) + 1] == "training", text  # its context tag (shown capitalised)
