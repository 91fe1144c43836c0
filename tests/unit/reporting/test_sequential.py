"""Group-sequential bounds for the paired t test: spending functions, the Monte Carlo bounds,
their overall type-I error, and input validation."""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist

import pytest

from fedcomm.reporting.sequential import (
    _bounds,
    overall_error,
    sequential_bounds,
    spent,
)
from fedcomm.reporting.verdict import t_critical

LOOKS = (3, 5)
CHECK = {"draws": 1_000_000, "seed": 4_242}  # independent of the bounds' own seed
SPENDINGS = ("pocock", "obrien_fleming")


# --- spending functions ------------------------------------------------------------------------


def test_spent_closed_forms() -> None:
    z = NormalDist().inv_cdf(0.975)
    assert spent(0.6, 0.05, "pocock") == pytest.approx(0.05 * math.log(1 + (math.e - 1) * 0.6))
    assert spent(0.6, 0.05, "pocock") == pytest.approx(0.035426, abs=1e-6)
    assert spent(0.6, 0.05, "obrien_fleming") == pytest.approx(
        2 - 2 * NormalDist().cdf(z / math.sqrt(0.6))
    )
    assert spent(0.6, 0.05, "obrien_fleming") == pytest.approx(0.011396, abs=1e-6)


@pytest.mark.parametrize("spending", SPENDINGS)
def test_spent_reaches_alpha_and_increases(spending: str) -> None:
    assert spent(1.0, 0.05, spending) == pytest.approx(0.05, rel=1e-12)  # type: ignore[arg-type]
    values = [spent(t / 10, 0.05, spending) for t in range(1, 11)]  # type: ignore[arg-type]
    assert all(a < b for a, b in itertools.pairwise(values))
    assert values[0] > 0


# --- bounds ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5, 10])
def test_single_look_is_the_fixed_test(n: int) -> None:
    assert sequential_bounds((n,)) == (t_critical(n - 1, 0.05),)
    assert sequential_bounds((n,), 0.01, "obrien_fleming") == (t_critical(n - 1, 0.01),)


@pytest.mark.parametrize("spending", SPENDINGS)
def test_first_bound_is_exact(spending: str) -> None:
    c1, _ = sequential_bounds(LOOKS, 0.05, spending)  # type: ignore[arg-type]
    assert c1 == t_critical(2, spent(0.6, 0.05, spending))  # type: ignore[arg-type]


@pytest.mark.parametrize("spending", SPENDINGS)
def test_overall_error_is_alpha(spending: str) -> None:
    bounds = sequential_bounds(LOOKS, 0.05, spending)  # type: ignore[arg-type]
    assert overall_error(LOOKS, bounds, **CHECK) == pytest.approx(0.05, abs=0.003)


def test_naive_thresholds_inflate_the_error() -> None:
    naive = (t_critical(2, 0.05), t_critical(4, 0.05))  # 2.920, 2.132
    error = overall_error(LOOKS, naive, **CHECK)
    assert 0.075 < error < 0.09


def test_simulation_matches_the_t_distribution() -> None:
    # Each look alone is Student's t (n − 1 df): also at a later look, built from merged blocks.
    assert overall_error((3,), (t_critical(2),), **CHECK) == pytest.approx(0.05, abs=0.002)
    assert overall_error(LOOKS, (math.inf, t_critical(4)), **CHECK) == pytest.approx(
        0.05, abs=0.002
    )
    assert overall_error((3, 4, 7), (math.inf, math.inf, t_critical(6, 0.1)), **CHECK) == (
        pytest.approx(0.1, abs=0.003)
    )


def test_spending_shapes() -> None:
    pocock = sequential_bounds(LOOKS, 0.05, "pocock")
    obf = sequential_bounds(LOOKS, 0.05, "obrien_fleming")
    fixed = t_critical(4, 0.05)  # 2.132
    assert obf[0] > pocock[0]  # O'Brien-Fleming spends little at the first look ...
    assert fixed < obf[1] < pocock[1]  # ... and keeps more for the last
    # the documented values (module docstring), to the Monte Carlo's accuracy
    assert pocock == pytest.approx((3.554, 2.826), abs=0.02)
    assert obf == pytest.approx((6.510, 2.269), abs=0.02)


def test_deterministic() -> None:
    first = sequential_bounds(LOOKS, 0.05, "pocock")
    assert _bounds.__wrapped__(LOOKS, 0.05, "pocock") == first  # recomputed, not the cache
    assert sequential_bounds([3, 5], 0.05, "pocock") == first  # a list works too


@pytest.mark.parametrize("spending", SPENDINGS)
def test_bounds_decrease_with_alpha(spending: str) -> None:
    usual, loose = (
        sequential_bounds(LOOKS, alpha, spending)  # type: ignore[arg-type]
        for alpha in (0.05, 0.1)
    )
    for a, b in zip(usual, loose, strict=True):
        assert a > b


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"looks": (5, 3)}, "looks"),
        ({"looks": (3, 3)}, "looks"),
        ({"looks": (1, 5)}, "looks"),
        ({"looks": ()}, "looks"),
        ({"looks": (3.0, 5)}, "looks"),
        ({"looks": "35"}, "looks"),
        ({"looks": (3, 5), "alpha": 0.0}, "alpha"),
        ({"looks": (3, 5), "alpha": 0.5}, "alpha"),
        ({"looks": (3, 5), "alpha": -0.1}, "alpha"),
        ({"looks": (3, 5), "spending": "haybittle"}, "spending"),
    ],
)
def test_bad_bounds_inputs(kwargs: dict[str, object], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        sequential_bounds(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "word"),
    [
        ((0.0, 0.05, "pocock"), "fraction"),
        ((1.1, 0.05, "pocock"), "fraction"),
        ((0.5, 0.6, "pocock"), "alpha"),
        ((0.5, 0.05, "linear"), "spending"),
    ],
)
def test_bad_spent_inputs(args: tuple[float, float, str], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        spent(*args)  # type: ignore[arg-type]


def test_bad_overall_error_inputs() -> None:
    with pytest.raises(ValueError, match="bounds"):
        overall_error(LOOKS, (2.0,))
    with pytest.raises(ValueError, match="bounds"):
        overall_error(LOOKS, (2.0, math.nan))
    with pytest.raises(ValueError, match="draws"):
        overall_error(LOOKS, (2.0, 2.0), draws=0)
    with pytest.raises(ValueError, match="looks"):
        overall_error((5, 3), (2.0, 2.0))
