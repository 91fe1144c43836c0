"""Group-sequential bounds for the paired t test of :mod:`fedcomm.reporting.verdict`.

Why: some claims are looked at twice — at ``n = 3`` seeds (threshold ``t_crit(2) = 2.920``)
and, when undecided, again at ``n = 5`` (``t_crit(4) = 2.132``). Spending the full 5% at both
looks lets a true null through either door: the overall type-I error of the naive pair
(2.920, 2.132) is about 8.2% (simulated 0.0819), not 5%.

The design: the claim "a − b > margin" is examined at seed counts ``n_1 < … < n_K`` with the
paired t statistic ``T_k = (mean(d_1..d_{n_k}) − margin) / (sd_k / √n_k)`` (``sd_k`` the sample
sd with ``n_k − 1`` df) and decided "reproduced" at the first look with ``T_k > c_k``. The
bounds spend ``alpha`` over the looks (Lan & DeMets): under H0 (``d`` iid
Normal(margin, σ²)) the chance of having stopped by look ``k`` is ``spent(t_k)`` at the
information fraction ``t_k = n_k / n_K``, so the overall type-I error is ``spent(1) = alpha``.
The one-sided spending functions (:func:`spent`):

* Pocock-type ``alpha · ln(1 + (e − 1)·t)`` — spends early; the bounds are close to each other,
  the last one well above the fixed-n critical value;
* O'Brien-Fleming-type ``2 − 2Φ(z_{1−α/2} / √t)`` — spends little early (a very high first
  bound); the last bound stays close to the fixed-n one.

``c_1 = t_critical(n_1 − 1, spent(t_1))`` exactly (Student's t of :mod:`.verdict`; beyond its
double precision, ``spent(t_1)`` below about 1e-15, ``c_1`` is merely "never in practice").
Each later ``c_k`` solves ``P(T_1 ≤ c_1, …, T_{k−1} ≤ c_{k−1}, T_k > c_k) =
spent(t_k) − spent(t_{k−1})``, which involves the joint law of the ``T``'s (they share seeds):
it is found by a deterministic Monte Carlo — :data:`DRAWS` = 4,000,000 null paths (t is
scale-free, so ``d`` ~ Normal(0, 1)) from ``numpy.random.default_rng(SEED)``, ``SEED`` = 29,
drawn through sufficient statistics (exact; two variates per path and look, see
:class:`_Paths`) — as the order statistic of the still-running paths' ``T_k`` above which
``round(increment · DRAWS)`` of them lie. Across 20 other seeds ``c_2`` for looks (3, 5) had
a standard deviation of 0.003 (Pocock) and 0.002 (O'Brien-Fleming): the bounds are good to
about ±0.006. One call takes about 0.6 s (two looks, on a loaded CPU) and some 160 MB at
peak; results are cached (``functools.lru_cache``). A single look is the fixed-n test:
``(t_critical(n − 1, alpha),)``.

Looks (3, 5) at alpha = 0.05 (information fractions 0.6 and 1):

============== ============== ======= ======= ====================================
spending       spent(0.6)     c_1     c_2     overall error (independent check)
============== ============== ======= ======= ====================================
Pocock         0.03543        3.554   2.826   0.0501 (4,000,000 draws, seed 2029)
O'Brien-Flem.  0.01140        6.510   2.269   0.0502 (4,000,000 draws, seed 2029)
naive          0.05 per look  2.920   2.132   0.0819
============== ============== ======= ======= ====================================

(:func:`overall_error` simulates such a check.) Both keep the claim's 5%; O'Brien-Fleming
asks for much more at 3 seeds (6.51 vs 3.55) and less at 5 (2.27 vs 2.83).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

import numpy as np

from fedcomm.reporting.verdict import t_critical

Spending = Literal["pocock", "obrien_fleming"]
SPENDINGS: tuple[str, ...] = ("pocock", "obrien_fleming")

DRAWS = 4_000_000
"""Monte Carlo draws behind each bound of :func:`sequential_bounds`."""
SEED = 29
"""The seed of :func:`sequential_bounds`; fixed, so the bounds are reproducible."""
CHECK_SEED = 2_029
"""The default seed of :func:`overall_error`: independent of :data:`SEED`, so a check of the
bounds does not reuse the draws that made them."""


# --- validation --------------------------------------------------------------------------------


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5) (got {alpha})")
    return alpha


def _check_spending(spending: str) -> Spending:
    if spending == "pocock":
        return "pocock"
    if spending == "obrien_fleming":
        return "obrien_fleming"
    raise ValueError(f"spending must be one of {', '.join(SPENDINGS)} (got {spending!r})")


def _check_looks(looks: Sequence[int]) -> tuple[int, ...]:
    if isinstance(looks, str | bytes) or not isinstance(looks, Sequence):
        raise ValueError(f"looks must be a sequence of seed counts (got {looks!r})")
    out: list[int] = []
    for n in looks:
        if isinstance(n, bool):
            raise ValueError(f"looks must hold integers (got {n!r})")
        try:
            k = operator.index(n)
        except TypeError:
            raise ValueError(f"looks must hold integers (got {n!r})") from None
        if k < 2:
            raise ValueError(f"looks must each be >= 2 (a t statistic needs 2 seeds; got {k})")
        if out and k <= out[-1]:
            raise ValueError(f"looks must be strictly increasing (got {tuple(looks)})")
        out.append(k)
    if not out:
        raise ValueError("looks must name at least one look (got none)")
    return tuple(out)


# --- spending functions ------------------------------------------------------------------------


def spent(fraction: float, alpha: float, spending: Spending) -> float:
    """The type-I error spent by information fraction ``t`` (Lan & DeMets, one-sided).

    ``"pocock"``: ``alpha · ln(1 + (e − 1)·t)``; ``"obrien_fleming"``:
    ``2 − 2Φ(z_{1−α/2} / √t)``. Both are increasing in ``t`` and equal ``alpha`` at ``t = 1``.
    """
    alpha = _check_alpha(alpha)
    spending = _check_spending(spending)
    fraction = float(fraction)
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1] (got {fraction})")
    if spending == "pocock":
        return alpha * math.log1p((math.e - 1.0) * fraction)
    z = NormalDist().inv_cdf(1.0 - alpha / 2.0)
    # 2 − 2Φ(x) = erfc(x / √2), without the cancellation of 2 − 2·(1 + erf)/2 far in the tail.
    return math.erfc(z / math.sqrt(fraction) / math.sqrt(2.0))


# --- Monte Carlo -------------------------------------------------------------------------------


class _Paths:
    """The paired t statistics ``T_k`` of ``draws`` null paths (d iid Normal(0, 1)) at
    ``looks``, one look at a time.

    Between looks only sufficient statistics are drawn: a block of ``m`` new seeds has sum
    ``~ Normal(0, m)`` and, independently, within-block sum of squared deviations
    ``~ χ²(m − 1)``; the running sum of squared deviations is merged by Chan et al.'s update.
    This is exact in distribution and costs two variates per path and look whatever the look
    sizes.
    """

    def __init__(self, draws: int, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.draws = draws
        self.n = 0
        self.total = np.zeros(draws)
        self.ss = np.zeros(draws)

    def advance(self, n: int) -> np.ndarray:
        """Add seeds up to ``n`` in all; return the ``T`` statistics at ``n``."""
        m = n - self.n
        block_sum = self.rng.standard_normal(self.draws)
        block_sum *= math.sqrt(m)
        if self.n > 0:
            delta = self.total / self.n
            delta -= block_sum / m
            delta *= delta
            delta *= self.n * m / n
            self.ss += delta
            del delta
        if m > 1:
            self.ss += self.rng.chisquare(m - 1, self.draws)
        self.total += block_sum
        del block_sum
        self.n = n
        t = self.ss / (n - 1)
        np.sqrt(t, out=t)
        t *= math.sqrt(n)
        with np.errstate(divide="ignore", invalid="ignore"):
            np.divide(self.total, t, out=t)
        return t


@lru_cache(maxsize=64)
def _bounds(looks: tuple[int, ...], alpha: float, spending: Spending) -> tuple[float, ...]:
    if len(looks) == 1:  # the fixed-n test
        return (t_critical(looks[0] - 1, alpha),)
    last = looks[-1]
    cumulative = [spent(n / last, alpha, spending) for n in looks[:-1]] + [alpha]  # spent(1)
    bounds = [t_critical(looks[0] - 1, cumulative[0])]
    paths = _Paths(DRAWS, SEED)
    going = paths.advance(looks[0]) <= bounds[0]  # paths not yet stopped
    for k in range(1, len(looks)):
        t_k = paths.advance(looks[k])
        increment = cumulative[k] - cumulative[k - 1]
        rejects = round(increment * DRAWS)  # how many paths should first stop here
        values = t_k[going]
        if increment <= 0.0:
            bound = math.inf
        elif rejects < 1:  # below the Monte Carlo's resolution: no path stops here
            bound = float(values.max())
        elif rejects >= values.size:
            raise ValueError(f"alpha too large for looks {looks}: nothing left to spend")
        else:
            # Exactly `rejects` continuing paths lie above the midpoint of the two order
            # statistics around it (the rank-th and (rank+1)-th largest).
            top = np.partition(values, values.size - rejects - 1)[values.size - rejects - 1 :]
            bound = 0.5 * (float(top[0]) + float(top[1:].min()))
        bounds.append(bound)
        going &= t_k <= bound
    return tuple(bounds)


def sequential_bounds(
    looks: Sequence[int], alpha: float = 0.05, spending: Spending = "pocock"
) -> tuple[float, ...]:
    """The critical values ``c_1 … c_K`` of the one-sided paired t statistic at ``looks``.

    ``looks`` are the seed counts ``n_1 < … < n_K`` at which the claim is examined; it is
    decided "reproduced" at the first look ``k`` with ``T_k > c_k``. Under the null the chance
    of stopping by look ``k`` is ``spent(n_k / n_K, alpha, spending)``: ``c_1`` is the exact t
    critical value at that level; later bounds come from a seeded Monte Carlo (:data:`SEED`,
    :data:`DRAWS`). Results are cached.

    Raises:
        ValueError: ``looks`` empty, not strictly increasing, or with a count below 2;
            ``alpha`` outside (0, 0.5); ``spending`` unknown.
    """
    return _bounds(_check_looks(looks), _check_alpha(alpha), _check_spending(spending))


def overall_error(
    looks: Sequence[int],
    bounds: Sequence[float],
    draws: int = DRAWS,
    seed: int = CHECK_SEED,
) -> float:
    """The simulated null probability that some look's ``T_k`` exceeds its bound ``c_k``
    (the design's overall type-I error; Monte Carlo standard error ``√(p(1 − p) / draws)``,
    about 0.00015 at 2,000,000 draws and p = 0.05)."""
    looks = _check_looks(looks)
    values = tuple(float(c) for c in bounds)
    if len(values) != len(looks):
        raise ValueError(f"bounds must have one value per look ({len(looks)}; got {len(values)})")
    if any(math.isnan(c) for c in values):
        raise ValueError(f"bounds must be numbers (got {values})")
    draws = operator.index(draws)
    if draws < 1:
        raise ValueError(f"draws must be >= 1 (got {draws})")
    paths = _Paths(draws, seed)
    stopped = np.zeros(draws, dtype=bool)
    for n, c in zip(looks, values, strict=True):
        stopped |= paths.advance(n) > c
    return float(stopped.mean())
