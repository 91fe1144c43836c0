"""docs/time_policies.md's results are what pipeline/time_policies_report.py computes from the
committed per-seed curves (edit the data, or the page by hand, and this fails)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "pipeline" / "time_policies_report.py"


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
    for f in (ROOT / "docs/time_policies/data").glob("*.csv"):
        (data / f.name).write_bytes(f.read_bytes())
    first = sorted(data.glob("time_policies_sync_s*.csv"))[0]
    frame = pl.read_csv(first)
    frame.with_columns(pl.col("global_accuracy") * 0.5).write_csv(first)  # half the accuracy
    page = tmp_path / "page.md"
    page.write_text((ROOT / "docs/time_policies.md").read_text())
    done = _run("--check", "--data", str(data), "--page", str(page))
    assert done.returncode == 1 and "out of date" in done.stderr
