"""benchmarks/system_overhead.py runs end to end (1 repetition of 2 rounds) and records what it
claims: the three settings' seconds per round, their ratios, and a deadline that drops clients."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_overhead_benchmark_writes_its_numbers(tmp_path: Path, data_root: Path) -> None:
    out = tmp_path / "overhead.json"
    proc = subprocess.run(
        [sys.executable, "benchmarks/system_overhead.py", "--reps", "1", "--rounds", "3",
         "--out", str(out)],
        cwd=ROOT, env={"FEDCOMM_DATA_ROOT": str(data_root), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(out.read_text())
    assert set(got["median_s_per_round"]) == {"off", "clock", "deadline"}
    assert all(len(v) == 2 for v in got["samples"].values())  # round 1 left out
    assert (
        got["clock_over_off"]
        == got["median_s_per_round"]["clock"] / got["median_s_per_round"]["off"]
    )
    assert got["deadline_mean_dropped"] > 0  # the deadline setting does drop clients
