"""docs/time_policies.md's results are what pipeline/time_policies_report.py computes from the
committed per-seed curves (edit the data, or the page by hand, and this fails)."""

from __future__ import annotations

from pathlib import Path

from tests.pipeline.page_reports import ROOT, check_with_halved_accuracy, run_report

SCRIPT = ROOT / "pipeline" / "time_policies_report.py"


def test_the_page_is_what_the_data_give() -> None:
    done = run_report(SCRIPT, "--check")
    assert done.returncode == 0, done.stderr


def test_a_changed_number_is_caught(tmp_path: Path) -> None:
    done = check_with_halved_accuracy(
        SCRIPT, ROOT / "docs/time_policies/data", "time_policies_sync_s*.csv",
        ROOT / "docs/time_policies.md", tmp_path,
    )  # fmt: skip
    assert done.returncode == 1 and "out of date" in done.stderr
