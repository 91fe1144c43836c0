"""When a client online now goes offline (issue 45: availability over a client's whole interval):
the end of its window, touching windows joined, across periods too."""

from __future__ import annotations

import math

import numpy as np

from fedcomm.system.tables import Windows


def _windows(rows: list[tuple[int, float, float]], period: float | None = None) -> Windows:
    ids, start, end = (np.array(c) for c in zip(*rows, strict=True))
    per = None if period is None else np.full(len(ids), period)
    return Windows(ids.astype(np.int64), start.astype(float), end.astype(float), per)


def test_the_end_of_the_window_holding_the_time() -> None:
    w = _windows([(0, 10, 20), (0, 20, 30), (0, 50, 60), (1, 0, math.inf)])
    assert w.offline_at(0, 12) == 30  # [10, 20) and [20, 30) touch: one stay
    assert w.offline_at(0, 55) == 60
    assert w.offline_at(0, 35) == 35  # offline then: now
    assert w.offline_at(1, 1e9) == math.inf
    assert w.offline_at(7, 3) == 3  # no row: never online


def test_periodic_windows_wrap_into_the_next_period() -> None:
    w = _windows([(0, 0, 10), (0, 80, 100), (1, 0, 100)], period=100)
    assert w.offline_at(0, 85) == 110  # [80, 100) then the next period's [0, 10)
    assert w.offline_at(0, 205) == 210
    assert w.offline_at(0, 50) == 50
    assert w.offline_at(1, 3) == math.inf  # online the whole period


def test_offline_at_agrees_with_online() -> None:
    w = _windows([(0, 5, 7), (0, 9, 12), (0, 12, 13)], period=20)
    for t in np.arange(0, 60, 0.25):
        end = w.offline_at(0, float(t))
        if w.online(0, float(t)):
            assert end > t
            assert all(w.online(0, float(x)) for x in np.arange(t, end, 0.25))
            assert not w.online(0, end)
        else:
            assert end == t
