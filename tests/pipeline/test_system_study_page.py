"""docs/system_study.md's tables are what pipeline/system_study_report.py computes from the
committed per-seed curves (edit the data, or the page by hand, and this fails)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "pipeline" / "system_study_report.py"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_the_page_is_what_the_data_give() -> None:
    done = _run("--check")
    assert done.returncode == 0, done.stderr


def test_a_changed_number_is_caught(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    for f in (ROOT / "docs/system_study/data").glob("*.csv"):
        (data / f.name).write_bytes(f.read_bytes())
    first = sorted(data.glob("system_study_s*.csv"))[0]
    frame = pl.read_csv(first)
    frame.with_columns(pl.col("global_accuracy") * 0.5).write_csv(first)  # half the accuracy
    page = tmp_path / "page.md"
    page.write_text((ROOT / "docs/system_study.md").read_text())
    done = _run("--check", "--data", str(data), "--page", str(page))
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
