"""Oort's participant selection (issue 45): utility from the last loss, a penalty for clients
slower than the preferred duration, exploration of clients never seen, the pacer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedcomm.system import oort

CFG = oort.OortConfig(kind="oort")


def _arms(n: int = 40, **cfg: object) -> tuple[oort.OortConfig, oort.Arms]:
    c = oort.OortConfig(kind="oort", **cfg)  # type: ignore[arg-type]
    sizes = np.full(n, 100.0)
    return c, oort.Arms.start(c, sizes, np.linspace(1.0, 40.0, n))


def test_exploration_takes_never_seen_clients_then_decays_to_its_floor() -> None:
    cfg, arms = _arms()
    rng = np.random.default_rng(0)
    first = oort.select(cfg, arms, range(40), 10, 1, rng)
    assert len(first) == 10 and len(set(first)) == 10
    assert arms.exploration == pytest.approx(0.9 * 0.98)
    for r in range(2, 200):
        oort.select(cfg, arms, range(40), 10, r, rng)
    assert arms.exploration == cfg.exploration_min


def test_unexplored_clients_are_preferred_fast_when_sizes_are_equal() -> None:
    cfg, arms = _arms(exploration_factor=1.0, exploration_min=1.0, sample_window=1.0)
    chosen = oort.select(cfg, arms, range(40), 5, 1, np.random.default_rng(0))
    # T is the 30th percentile of the durations; the window holds the 5 best by
    # size x penalty: the fastest ones (no penalty) tie at the top
    t_pref = np.sort(arms.duration)[int(40 * 0.3)]
    assert all(arms.duration[c] <= t_pref for c in chosen)


def test_utility_is_the_loss_term_times_the_duration_penalty() -> None:
    cfg, arms = _arms(n=3)
    for c, (reward, dur) in enumerate([(10.0, 1.0), (20.0, 1.0), (20.0, 4.0)]):
        arms.update(c, reward, dur, 1)
    t_pref = 2.0
    scores = oort._scores(cfg, arms, [0, 1, 2], 2, t_pref)
    low, span = 10.0 * 0.999, 20.0 - 10.0 * 0.999
    clip = np.sort(arms.reward)[int(3 * 0.9)]  # the 0.9 quantile: the largest of three
    bonus = math.sqrt(0.1 * math.log(2) / 1)
    assert scores[0] == pytest.approx((10.0 - low) / span + bonus)
    assert scores[1] == pytest.approx((min(20.0, clip) - low) / span + bonus)
    assert scores[2] == pytest.approx(scores[1] * (t_pref / 4.0) ** 2)  # 2x too slow: 1/4


def test_exploitation_favours_high_utility_clients() -> None:
    cfg, arms = _arms(n=40, exploration_factor=0.0, exploration_min=0.0)
    for c in range(40):
        arms.update(c, 1.0 if c < 30 else 100.0, 1.0, 1)
    counts = np.zeros(40)
    rng = np.random.default_rng(1)
    for r in range(2, 52):
        for c in oort.select(cfg, arms, range(40), 5, r, rng):
            counts[c] += 1
        for c in range(40):  # keep the rewards fixed (as if they reported the same loss)
            arms.last_round[c] = 1
    # normalised utility ~1 + bonus against ~0 + bonus: drawn about 2.5x as often each
    assert counts[30:].mean() > 2 * counts[:30].mean()


def test_few_online_clients_are_all_taken() -> None:
    cfg, arms = _arms()
    assert oort.select(cfg, arms, [7, 3, 5], 10, 1, np.random.default_rng(0)) == [3, 5, 7]


def test_the_pacer_relaxes_t_when_utility_is_flat() -> None:
    cfg, arms = _arms(pacer_step=2, exploration_factor=0.0, exploration_min=0.0)
    for c in range(40):
        arms.update(c, 5.0, 1.0, 1)
    rng = np.random.default_rng(0)
    for r in range(2, 9):
        for c in oort.select(cfg, arms, range(40), 5, r, rng):
            arms.update(c, 5.0, 1.0, r)  # the same utility every round: flat
    assert arms.round_threshold > cfg.round_threshold


def test_config_names_a_bad_value() -> None:
    with pytest.raises(ValueError, match="round_threshold"):
        oort.OortConfig(kind="oort", round_threshold=0)
