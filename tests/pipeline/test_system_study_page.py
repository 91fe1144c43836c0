"""docs/system_study.md's tables are what pipeline/system_study_report.py computes from the
committed per-seed curves (edit the data, or the page by hand, and this fails)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.pipeline.page_reports import ROOT, check_with_halved_accuracy, run_report

SCRIPT = ROOT / "pipeline" / "system_study_report.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return run_report(SCRIPT, *args)


def test_the_page_is_what_the_data_give() -> None:
    done = _run("--check")
    assert done.returncode == 0, done.stderr


def test_a_changed_number_is_caught(tmp_path: Path) -> None:
    done = check_with_halved_accuracy(
        SCRIPT, ROOT / "docs/system_study/data", "system_study_s*.csv",
        ROOT / "docs/system_study.md", tmp_path,
    )  # fmt: skip
    assert done.returncode == 1 and "out of date" in done.stderr


@pytest.mark.parametrize("missing", ["block", "data"])
def test_bad_input_is_one_clear_error(tmp_path: Path, missing: str) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "no markers here\n" if missing == "block" else (ROOT / "docs/system_study.md").read_text()
    )
    data = ROOT / "docs/system_study/data" if missing == "block" else tmp_path
    done = _run("--check", "--data", str(data), "--page", str(page))
    assert done.returncode == 2
    assert (
        ("no <!-- study:begin" in done.stderr)
        if missing == "block"
        else ("no curves" in done.stderr)
    )
