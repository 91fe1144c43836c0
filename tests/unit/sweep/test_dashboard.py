"""The study of a `fedcomm sweep` opens in optuna-dashboard (the ``dashboard`` extra), with the
command docs/sweeps.md gives: ``optuna-dashboard .optuna/<study>.log``. A real two-trial sweep
(digits, tracking off) writes the journal; the dashboard's HTTP API lists the study and its
trials. Skipped where optuna-dashboard is not installed, except under CI, which installs it
(``.[dev]``) and must run it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from fedcomm.sweep.storage import journal_path
from fedcomm.sweep.study import run_sweep
from tests.conftest import tiny_params
from tests.pipeline.servers import free_port

try:
    import optuna_dashboard  # noqa: F401
except ImportError:
    MESSAGE = "optuna-dashboard is not installed (pip install -e '.[dashboard]')"
    if os.environ.get("CI"):
        pytest.fail(MESSAGE, pytrace=False)  # CI installs .[dev], which holds it
    pytest.skip(MESSAGE, allow_module_level=True)

pytestmark = pytest.mark.slow  # a sweep and a server, as the other sweep tests

LR = "train.local.lr"


def _dashboard_command() -> list[str]:
    """The ``optuna-dashboard`` script of this interpreter's environment (else of PATH)."""
    beside = Path(sys.executable).with_name("optuna-dashboard")
    found = str(beside) if beside.is_file() else shutil.which("optuna-dashboard")
    assert found, "optuna_dashboard is importable but its optuna-dashboard command is missing"
    return [found]


def _get(url: str, deadline: float, proc: subprocess.Popen[bytes], log: Path) -> Any:
    """``url``'s JSON, retried until the server answers (or died, or ``deadline`` passed)."""
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                return json.loads(resp.read())
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None or time.monotonic() > deadline:
                out = log.read_text(errors="replace")[-3000:]
                raise AssertionError(f"optuna-dashboard did not answer {url}:\n{out}") from None
            time.sleep(0.25)


def test_a_sweeps_study_opens_in_optuna_dashboard(project: Path) -> None:
    base = tiny_params(**{"experiment.runs": ["fedavg"], "tracking.enabled": False})
    (project / "base.yaml").write_text(yaml.safe_dump(base))
    space = project / "lr.yaml"
    space.write_text(
        yaml.safe_dump(
            {
                "base": "base.yaml",
                "run": "fedavg",
                "trials": 2,
                "sampler": {"name": "random", "seed": 0},
                "space": {LR: {"type": "float", "low": 0.02, "high": 0.3, "log": True}},
            }
        )
    )
    result = run_sweep(space, root=project)
    assert (result.study, result.finished) == ("lr", 2)
    log = journal_path(None, "lr", project)
    assert log == project / ".optuna" / "lr.log" and log.is_file()

    port = free_port()
    cmd = [*_dashboard_command(), str(log.relative_to(project)), "--host", "127.0.0.1"]
    out = project / "dashboard.log"
    with (
        out.open("wb") as sink,
        subprocess.Popen(
            [*cmd, "--port", str(port)], cwd=project, stdout=sink, stderr=sink
        ) as proc,
    ):
        try:
            deadline = time.monotonic() + 120
            api = f"http://127.0.0.1:{port}/api/studies"
            studies = _get(api, deadline, proc, out)["study_summaries"]
            (study,) = [s for s in studies if s["study_name"] == "lr"]
            detail = _get(f"{api}/{study['study_id']}", deadline, proc, out)
        finally:
            proc.kill()  # (the dashboard holds nothing to save; leaving the block waits for it)
    trials = detail["trials"]
    assert [t["state"] for t in trials] == ["Complete", "Complete"]
    assert all(t["params"][0]["name"] == LR for t in trials)
    assert [len(t["values"]) for t in trials] == [1, 1]  # the objective: final accuracy
