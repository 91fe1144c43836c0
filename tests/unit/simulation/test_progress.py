"""Progress outside a terminal: one short line every tenth of the run, so logs show it."""

from __future__ import annotations

import pytest

from fedcomm.simulation.progress import round_progress


def test_log_lines_every_tenth_of_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    with round_progress("fedavg-s0", 25) as update:  # stderr is captured: not a terminal
        for r in range(1, 26):
            acc = 0.5 + r / 100 if r % 5 == 0 else None
            update(r, {"global/accuracy": acc, "local/accuracy": 0.9, "comm/cum_gib": r / 1000})
    lines = capsys.readouterr().err.splitlines()
    assert [line.split()[2] for line in lines] == [
        f"{r}/25" for r in (2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 25)
    ]
    assert lines[0] == "fedavg-s0: round 2/25  acc -  local 90.00%  0.002 GiB"
    assert lines[-1] == "fedavg-s0: round 25/25  acc 75.00%  local 90.00%  0.025 GiB"
    assert "acc 60.00%" in lines[5]  # round 12 shows round 10's accuracy, the latest measured


def test_disabled_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with round_progress("x", 3, enabled=False) as update:
        for r in (1, 2, 3):
            update(r, {})
    assert capsys.readouterr().err == ""
