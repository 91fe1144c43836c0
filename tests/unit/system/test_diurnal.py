"""The diurnal availability model (issue 45): one daily window per client, drawn once. The draws
follow their laws (Dvoretzky-Kiefer-Wolfowitz bands from the sample size), a window integrates to
its duty cycle, ``offline_at`` is the window's end across midnight, the population swings
``peak_to_trough`` times, and every bad key is refused by name."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from fedcomm.system import diurnal
from fedcomm.system.diurnal import Diurnal, DiurnalClients, draw, online_fraction, resolved_kappa

DAY, H = 86400.0, 3600.0
N = 20_000
# DKW: P(sup |F_n - F| > eps) <= 2 exp(-2 N eps^2); at 1e-6 that is this eps
DKW = math.sqrt(math.log(2 / 1e-6) / (2 * N))


def _cfg(**over: Any) -> Diurnal:
    raw: dict[str, Any] = {
        "kind": "diurnal",
        "start": {"kind": "von_mises", "mean_h": 22.0},
        "duty": {"kind": "constant", "value": 0.25},
    }
    return Diurnal.model_validate({**raw, **over})


def _ks(sample: np.ndarray, cdf: Any) -> float:
    """sup |F_n - F| of ``sample`` against ``cdf``."""
    x = np.sort(sample)
    f = cdf(x)
    i = np.arange(1, len(x) + 1) / len(x)
    return float(max(np.max(i - f), np.max(f - (i - 1 / len(x)))))


def _von_mises_cdf(kappa: float, mean_h: float) -> Any:
    """The CDF of a von Mises hour on [mean_h - 12, mean_h + 12), by quadrature."""
    grid = np.linspace(-math.pi, math.pi, 200_001)
    dens = np.exp(kappa * (np.cos(grid) - 1))
    cum = np.concatenate([[0.0], np.cumsum((dens[1:] + dens[:-1]) / 2)])
    cum /= cum[-1]
    return lambda h: np.interp((h - mean_h) * 2 * math.pi / 24, grid, cum)


def test_duty_cycles_follow_their_distribution() -> None:
    uni = draw(_cfg(duty={"kind": "uniform", "low": 0.1, "high": 0.5}), N, np.random.default_rng(1))
    assert uni.duty.min() >= 0.1 and uni.duty.max() <= 0.5
    assert _ks(uni.duty, lambda x: (x - 0.1) / 0.4) < DKW
    beta = draw(_cfg(duty={"kind": "beta", "a": 2, "b": 5}), N, np.random.default_rng(2))
    # Beta(2, 5)'s CDF: the binomial sum 1 - (1 - x)^6 - 6 x (1 - x)^5
    assert _ks(beta.duty, lambda x: 1 - (1 - x) ** 6 - 6 * x * (1 - x) ** 5) < DKW
    const = draw(_cfg(duty={"kind": "constant", "value": 0.3}), 50, np.random.default_rng(3))
    assert np.all(const.length_s == 0.3 * DAY)
    assert uni.length_s.dtype == np.float64 and uni.start_s.dtype == np.float64


def test_the_beta_cdf_matches_closed_forms() -> None:
    x = np.linspace(0, 1, 101)
    arcsine = 2 / math.pi * np.arcsin(np.sqrt(x))  # Beta(1/2, 1/2)
    assert np.max(np.abs(diurnal._beta_cdf(0.5, 0.5, x) - arcsine)) < 1e-4
    assert (
        np.max(np.abs(diurnal._beta_cdf(2, 5, x) - (1 - (1 - x) ** 6 - 6 * x * (1 - x) ** 5)))
        < 1e-6
    )


def test_start_hours_follow_their_distribution() -> None:
    vm = draw(
        _cfg(start={"kind": "von_mises", "mean_h": 22.0, "kappa": 2.0}), N, np.random.default_rng(4)
    )
    hours = vm.start_s / H
    assert hours.min() >= 0 and hours.max() < 24
    unwrapped = np.mod(hours - 10.0, 24.0) + 10.0  # onto [22 - 12, 22 + 12)
    assert _ks(unwrapped, _von_mises_cdf(2.0, 22.0)) < DKW
    arc = draw(
        _cfg(start={"kind": "uniform", "low_h": 22, "high_h": 2}), N, np.random.default_rng(5)
    )
    h = arc.start_s / H
    assert np.all((h >= 22) | (h < 2))  # the arc wraps past midnight
    assert _ks(np.mod(h - 22, 24), lambda x: x / 4) < DKW
    one = draw(_cfg(start={"kind": "constant", "hour": 7.5}), 10, np.random.default_rng(6))
    assert np.all(one.start_s == 7.5 * H)


def test_offsets_follow_their_distribution() -> None:
    cfg = _cfg(offset={"kind": "choice", "hours": [-5, -8], "weights": [3, 1]})
    z = draw(cfg, N, np.random.default_rng(7)).offset_s / H
    share = float(np.mean(z == -5))
    assert set(np.unique(z)) == {-5.0, -8.0}
    assert abs(share - 0.75) < 5 * math.sqrt(0.75 * 0.25 / N)
    uni = draw(
        _cfg(offset={"kind": "uniform", "low_h": -8, "high_h": -5}), N, np.random.default_rng(8)
    )
    assert _ks(uni.offset_s / H, lambda x: (x + 8) / 3) < DKW


def test_online_mask_over_a_day_integrates_to_each_duty_cycle() -> None:
    cfg = _cfg(
        start={"kind": "uniform", "low_h": 0, "high_h": 24},
        duty={"kind": "uniform", "low": 0, "high": 1},
        offset={"kind": "uniform", "low_h": -12, "high_h": 12},
        origin_h=5.0,
    )
    clients = draw(cfg, 40, np.random.default_rng(9))
    step = 10.0
    for day0 in (0.0, 5.3 * DAY):  # any day, not only the first
        times = day0 + np.arange(0, DAY, step)
        on = np.array([clients.online_mask(np.arange(40), t) for t in times])  # [times, 40]
        # each window edge falls in one step: the share is the duty to two steps
        assert np.max(np.abs(on.mean(axis=0) - clients.duty)) <= 2 * step / DAY + 1e-12


def _clients(start_h: list[float], length_h: list[float], offset_h: list[float] | None = None,
             origin_h: float = 0.0) -> DiurnalClients:  # fmt: skip
    n = len(start_h)
    return DiurnalClients(
        period_s=DAY,
        start_s=np.array(start_h) * H,
        length_s=np.array(length_h) * H,
        offset_s=np.array(offset_h or [0.0] * n) * H,
        origin_s=origin_h * H,
    )


def test_offline_at_is_the_end_of_the_window_across_midnight() -> None:
    c = _clients([22.0], [4.0])  # online 22:00 -> 02:00
    assert c.offline_at(0, 22 * H) == 26 * H  # opens inclusive
    assert c.offline_at(0, 23 * H) == 26 * H  # to 02:00 the next day
    assert c.offline_at(0, 25 * H) == 26 * H
    assert c.offline_at(0, 1 * H) == 2 * H  # the window of the day before
    assert c.offline_at(0, 26 * H) == 26 * H  # closed at its end: offline, so now
    assert c.offline_at(0, 12 * H) == 12 * H
    assert c.offline_at(0, 3 * DAY + 23.5 * H) == 3 * DAY + 26 * H
    assert list(c.online_mask(np.array([0]), 23 * H)) == [True]
    assert list(c.online_mask(np.array([0]), 2 * H)) == [False]


def test_time_zones_and_the_origin_move_the_window() -> None:
    ahead = _clients([22.0], [4.0], offset_h=[2.0])  # its 22:00 is the reference's 20:00
    assert ahead.offline_at(0, 21 * H) == 24 * H
    assert ahead.offline_at(0, 24 * H) == 24 * H
    late = _clients([22.0], [4.0], origin_h=6.0)  # simulated 0 is 06:00: 22:00 is 16 h in
    assert late.offline_at(0, 17 * H) == 20 * H
    assert late.open_s[0] == 16 * H


def test_always_online_and_never_online() -> None:
    c = _clients([3.0, 3.0], [24.0, 0.0])
    ids = np.array([0, 1])
    for t in (0.0, 3 * H, 11.7 * H, 7 * DAY + 1.0):
        assert list(c.online_mask(ids, t)) == [True, False]
        assert c.offline_at(0, t) == math.inf
        assert c.offline_at(1, t) == t
    always = _cfg(start={"kind": "uniform", "low_h": 0, "high_h": 24},
                  duty={"kind": "constant", "value": 1.0})  # fmt: skip
    on = draw(always, 5, np.random.default_rng(0))
    assert all(on.offline_at(i, 123.0) == math.inf for i in range(5))


def test_offline_at_agrees_with_online_mask() -> None:
    rng = np.random.default_rng(10)
    minutes = 24 * 60
    c = DiurnalClients(
        period_s=DAY,
        start_s=rng.integers(0, minutes, 30) * 60.0,
        length_s=rng.integers(0, minutes + 1, 30) * 60.0,
        offset_s=rng.integers(-600, 600, 30) * 60.0,
    )
    for t in rng.integers(0, 3 * minutes, 200) * 60.0 + 30.0:
        for i in range(30):
            end = c.offline_at(i, float(t))
            if c.online_mask(np.array([i]), float(t))[0]:
                assert end > t
                if math.isfinite(end):
                    assert c.online_mask(np.array([i]), end - 1.0)[0]
                    assert not c.online_mask(np.array([i]), end)[0]
            else:
                assert end == t


def test_the_population_swings_peak_to_trough_times() -> None:
    cfg = _cfg()  # von Mises around 22:00, duty 0.25, the default peak_to_trough 4
    kappa = resolved_kappa(cfg)
    assert kappa is not None and kappa > 0
    times = np.arange(0, DAY, 60.0)
    f = online_fraction(cfg, times)
    assert f.max() / f.min() == pytest.approx(4.0, rel=1e-3)
    assert f.mean() == pytest.approx(0.25, abs=1e-3)  # a day's mean is the mean duty
    assert times[np.argmax(f)] / H == pytest.approx((22 + 3) % 24, abs=0.2)  # mid-window
    n = 40_000
    clients = draw(cfg, n, np.random.default_rng(11))
    hourly = np.arange(0, DAY, H)
    emp = np.array([clients.online_mask(np.arange(n), t).mean() for t in hourly])
    law = online_fraction(cfg, hourly)
    assert np.all(np.abs(emp - law) < 5 * np.sqrt(law * (1 - law) / n) + 2e-3)


def test_the_solver_accounts_for_duty_and_time_zones() -> None:
    cfg = _cfg(duty={"kind": "beta", "a": 2, "b": 5},
               offset={"kind": "choice", "hours": [-5, -6, -7, -8]})  # fmt: skip
    f = online_fraction(cfg, np.arange(0, DAY, 60.0))
    assert f.max() / f.min() == pytest.approx(4.0, rel=1e-3)
    wide = resolved_kappa(cfg)
    narrow = resolved_kappa(_cfg(duty={"kind": "beta", "a": 2, "b": 5}))
    assert wide is not None and narrow is not None and wide > narrow  # zones blur: more kappa
    assert resolved_kappa(_cfg(start={"kind": "von_mises", "mean_h": 1, "kappa": 3})) == 3
    assert resolved_kappa(_cfg(start={"kind": "constant", "hour": 1})) is None
    assert resolved_kappa(_cfg(start={"kind": "von_mises", "mean_h": 1, "peak_to_trough": 1})) == 0


def test_draws_are_seeded_and_in_order() -> None:
    cfg = _cfg(duty={"kind": "uniform", "low": 0.1, "high": 0.9})
    a = draw(cfg, 100, np.random.default_rng(12))
    b = draw(cfg, 100, np.random.default_rng(12))
    assert np.array_equal(a.start_s, b.start_s) and np.array_equal(a.length_s, b.length_s)
    assert not np.array_equal(a.start_s, draw(cfg, 100, np.random.default_rng(13)).start_s)
    # a constant start draws nothing: the duty cycles are the generator's first draws
    fixed = _cfg(
        start={"kind": "constant", "hour": 3}, duty={"kind": "uniform", "low": 0, "high": 1}
    )
    got = draw(fixed, 100, np.random.default_rng(14)).duty
    assert np.allclose(got, np.random.default_rng(14).uniform(0, 1, 100))
    assert len(draw(cfg, 0, np.random.default_rng(0))) == 0
    with pytest.raises(ValueError, match="n must be >= 0"):
        draw(cfg, -1, np.random.default_rng(0))


VM = {"kind": "von_mises", "mean_h": 1, "kappa": 1}
BAD: list[tuple[dict[str, Any], list[str]]] = [
    ({"duty": {"kind": "constant", "value": 1.5}},
     ["duty.constant.value", "1.5", "less than or equal to 1"]),
    ({"duty": {"kind": "uniform", "low": 0.6, "high": 0.2}},
     ["high must be >= low (got low=0.6, high=0.2)"]),
    ({"duty": {"kind": "lognormal", "median": 0.3}},
     ["'lognormal'", "'constant', 'uniform', 'beta'"]),
    ({"duty": {"kind": "beta", "a": 0, "b": 1}}, ["duty.beta.a", "greater than 0"]),
    ({"start": {"kind": "constant", "hour": 24}},
     ["start.constant.hour", "24", "less than 24"]),
    ({"start": {"kind": "uniform", "low_h": 5, "high_h": 5}}, ["both 5", "empty arc"]),
    ({"start": {**VM, "kappa": 2, "peak_to_trough": 3}}, ["not both"]),
    ({"duty": {"kind": "constant", "value": 1.0}},
     ["start.peak_to_trough 4.0 cannot be reached", "start.kappa"]),
    ({"offset": {"kind": "uniform", "low_h": -24, "high_h": 24}, "start": VM},
     ["low_h -24.0, high_h 24.0", "high_h <= low_h + 24"]),
    ({"offset": {"kind": "choice", "hours": [-5, -6], "weights": [1]}},
     ["weights [1.0]", "2 of them"]),
    ({"period_s": 0}, ["period_s", "greater than 0"]),
    ({"origin_h": -1}, ["origin_h", "greater than or equal to 0"]),
    ({"periode_s": 3600}, ["periode_s", "Extra inputs are not permitted"]),
    ({"start": None}, ["start"]),
]  # fmt: skip


@pytest.mark.parametrize(("over", "says"), BAD)
def test_bad_config_is_refused_by_name(over: dict[str, Any], says: list[str]) -> None:
    with pytest.raises(ValidationError) as err:
        _cfg(**over)
    text = str(err.value)
    for s in says:
        assert s in text, (s, text)


def test_start_and_duty_are_required() -> None:
    with pytest.raises(ValidationError) as err:
        Diurnal.model_validate({"kind": "diurnal"})
    text = str(err.value)
    assert "start\n  Field required" in text and "duty\n  Field required" in text
