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


def test_a_resumed_run_says_so_once(capsys: pytest.CaptureFixture[str]) -> None:
    with round_progress("fedavg-s0", 300, start=40) as update:  # log lines: not a terminal
        for r in range(41, 61):
            update(r, {"global/accuracy": 0.5})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "resuming fedavg-s0 from the checkpoint of round 40 of 300"
    assert [line.split()[2] for line in lines[1:]] == ["60/300"]  # then every 30th round, as ever


def test_a_resumed_runs_bar_starts_at_its_checkpoint(capsys: pytest.CaptureFixture[str]) -> None:
    with round_progress("fedavg-s0", 300, enabled=True, start=40):
        pass  # stopped before round 41: rich renders the bar's state as it stops
    captured = capsys.readouterr()
    assert captured.err == "resuming fedavg-s0 from the checkpoint of round 40 of 300\n"
    assert "fedavg-s0 (resumed at 40)" in captured.out and "40/300" in captured.out, captured


def test_a_fresh_run_says_nothing_of_resuming(capsys: pytest.CaptureFixture[str]) -> None:
    with round_progress("fedavg-s0", 3, enabled=True) as update:
        update(1, {})
    captured = capsys.readouterr()
    assert "resum" not in captured.err + captured.out and "1/3" in captured.out
