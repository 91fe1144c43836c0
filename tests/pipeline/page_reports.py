"""What the page-report tests share (pipeline/page_block.py's scripts): run a report script, and
check that a changed number in a copy of its data makes ``--check`` fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parents[2]


def run_report(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``script`` run from the repository root with ``args``."""
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def check_with_halved_accuracy(
    script: Path, data_dir: Path, first: str, page: Path, tmp_path: Path
) -> subprocess.CompletedProcess[str]:
    """``script --check`` on a copy of ``data_dir`` whose first ``first`` curve has half its
    accuracy, against a copy of ``page``."""
    data = tmp_path / "data"
    data.mkdir()
    for f in data_dir.glob("*.csv"):
        (data / f.name).write_bytes(f.read_bytes())
    target = sorted(data.glob(first))[0]
    pl.read_csv(target).with_columns(pl.col("global_accuracy") * 0.5).write_csv(target)
    copy = tmp_path / "page.md"
    copy.write_text(page.read_text())
    return run_report(script, "--check", "--data", str(data), "--page", str(copy))
