"""The claims' decision rule: a paired comparison over seeds, decided by a one-sided t test.

A claim "a − b > margin" (``direction="greater"``) or "a − b < margin" (``"less"``) is
*reproduced* when, over the ``n ≥ 3`` seeds both arms have, the paired differences
``d = a − b`` (same seed: same partition and initialisation) give a one-sided t statistic
``t = (mean(d) − margin) / SE(d)`` beyond the critical value of Student's t at ``n − 1`` degrees
of freedom and level ``alpha`` (2.920 for n = 3, 2.132 for n = 5 at 5%). Otherwise it is
*in direction, not significant* (``mean(d) − margin`` has the claimed sign) or *not
reproduced* (the other sign, or 0). ``SE(d) = 0`` is decided by the sign alone (t = ±∞).

"Final" accuracy is the mean of the last ``last_k`` evaluations of a seed's curve
(:func:`final_per_seed`), not one noisy point.

Student's t is computed here (no scipy): its CDF through the regularized incomplete beta
function (a Lentz continued fraction), the critical value by bisection on the CDF.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import polars as pl

Sign = Literal["greater", "less"]

REPRODUCED = "reproduced"
IN_DIRECTION = "in direction, not significant"
NOT_REPRODUCED = "not reproduced"
TOO_FEW = "too few seeds"
PENDING = "pending"
MIN_SEEDS = 3


# --- Student's t -------------------------------------------------------------------------------


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz, NR 6.4)."""
    tiny, eps = 1e-300, 1e-15

    def nonzero(v: float) -> float:
        return v if abs(v) > tiny else tiny

    c, d = 1.0, 1.0 / nonzero(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, 10_000):
        even = m * (b - m) * x / ((a + 2 * m - 1.0) * (a + 2 * m))
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1.0))
        for coef in (even, odd):
            d = 1.0 / nonzero(1.0 + coef * d)
            c = nonzero(1.0 + coef / c)
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta: no convergence for a={a}, b={b}, x={x}")


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` for ``a, b > 0``, ``0 ≤ x ≤ 1``."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"betainc: x must be in [0, 1] (got {x})")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):  # the fraction converges fast on this side
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """``P(T ≤ t)`` for Student's t with ``df > 0`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"t_cdf: df must be > 0 (got {df})")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))  # P(T > |t|)
    return 1.0 - tail if t >= 0 else tail


def t_critical(df: float, alpha: float = 0.05) -> float:
    """The one-sided critical value ``t*`` with ``P(T > t*) = alpha`` at ``df`` degrees of
    freedom (6.314 at df 1, 2.920 at df 2, 2.132 at df 4; 1.645 as df → ∞ at 5%)."""
    if not 0.0 < alpha < 0.5:
        raise ValueError(f"t_critical: alpha must be in (0, 0.5) (got {alpha})")
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < 1.0 - alpha:
        hi *= 2.0
    for _ in range(200):  # bisection to machine precision
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < 1.0 - alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-13 * hi:
            break
    return 0.5 * (lo + hi)


# --- "final" per seed --------------------------------------------------------------------------


@dataclass(frozen=True)
class Finals:
    """A run's final value per seed: the mean of its last ``k`` evaluations (fewer where a seed
    has fewer: ``fewest`` is the smallest number averaged)."""

    values: dict[int, float]
    k: int
    fewest: int


def final_per_seed(
    curves: pl.DataFrame,
    run: str,
    metric: str,
    *,
    last_k: int,
    seeds: list[int] | None = None,
    at_round: int | None = None,
) -> Finals:
    """The final ``metric`` of each seed of ``run`` in a long curves table.

    Args:
        curves: columns ``run``, ``seed``, ``round`` and ``metric`` (one row per round; rows
            where ``metric`` is null or NaN are rounds without that evaluation, as for
            :func:`~fedcomm.evaluation.curve_points.final_value`).
        run: the run label (column ``run``).
        metric: the metric column.
        last_k: how many of the last evaluations to average.
        seeds: only these seeds (default: every seed of the run).
        at_round: only evaluations at or before this round.

    Returns:
        :class:`Finals`; a seed without any evaluation is left out.
    """
    if last_k < 1:
        raise ValueError(f"last_k must be >= 1 (got {last_k})")
    value = pl.col(metric).cast(pl.Float64).fill_nan(None)  # NaN: not evaluated, as null
    rows = curves.filter((pl.col("run") == run) & value.is_not_null())
    if seeds is not None:
        rows = rows.filter(pl.col("seed").is_in(seeds))
    if at_round is not None:
        rows = rows.filter(pl.col("round") <= at_round)
    last = (
        rows.sort("seed", "round")
        .group_by("seed", maintain_order=True)
        .agg(pl.col(metric).cast(pl.Float64).tail(last_k).alias("tail"))
    )
    values = {
        int(s): float(sum(t) / len(t)) for s, t in zip(last["seed"], last["tail"], strict=True)
    }
    fewest = min((len(t) for t in last["tail"]), default=last_k)
    return Finals(values, last_k, min(fewest, last_k))


# --- the paired comparison ---------------------------------------------------------------------


@dataclass(frozen=True)
class Paired:
    """One paired comparison ``d = a − b`` over the seeds both arms have, and its verdict.

    ``t`` is ``(mean − margin) / se`` (±inf when ``se`` is 0 and the mean is off the margin;
    None below 2 seeds); ``t_crit`` the one-sided critical value at ``df = n − 1``."""

    seeds: tuple[int, ...]
    d: tuple[float, ...]
    direction: Sign
    margin: float
    alpha: float
    verdict: str
    mean: float | None = None
    se: float | None = None
    t: float | None = None
    t_crit: float | None = None
    a: dict[int, float] = field(default_factory=dict)
    b: dict[int, float] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.seeds)

    @property
    def df(self) -> int | None:
        return self.n - 1 if self.n >= 2 else None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready numbers (infinite t as the strings ``"inf"``/``"-inf"``)."""
        t: object = self.t
        if self.t is not None and math.isinf(self.t):
            t = "inf" if self.t > 0 else "-inf"
        return {
            "verdict": self.verdict,
            "n": self.n,
            "seeds": list(self.seeds),
            "d": list(self.d),
            "mean": self.mean,
            "se": self.se,
            "t": t,
            "df": self.df,
            "t_crit": self.t_crit,
            "direction": self.direction,
            "margin": self.margin,
            "alpha": self.alpha,
            "per_seed": {
                "a": {str(s): v for s, v in self.a.items()},
                "b": {str(s): v for s, v in self.b.items()},
            },
        }


def paired(
    a: Mapping[int, float],
    b: Mapping[int, float],
    *,
    direction: Sign = "greater",
    margin: float = 0.0,
    alpha: float = 0.05,
    scale: float = 1.0,
    t_crit: float | None = None,
) -> Paired:
    """Decide "a − b > margin" (or ``< margin``) over the seeds both ``a`` and ``b`` have.

    ``a`` and ``b`` are per-seed values; the differences are taken per seed and multiplied by
    ``scale`` (e.g. 100 for accuracy points), and ``margin`` is in those shown units.
    ``t_crit`` replaces the fixed-n critical value (a group-sequential design's bound for this
    look, :mod:`.sequential`).
    """
    seeds = tuple(sorted(set(a) & set(b)))
    d = tuple(scale * (a[s] - b[s]) for s in seeds)
    a_used, b_used = {s: a[s] for s in seeds}, {s: b[s] for s in seeds}
    common = {"direction": direction, "margin": margin, "alpha": alpha, "a": a_used, "b": b_used}
    if not d:
        return Paired(seeds, d, verdict=TOO_FEW, **common)  # type: ignore[arg-type]
    n = len(d)
    mean = sum(d) / n
    if n < 2:
        return Paired(seeds, d, verdict=TOO_FEW, mean=mean, **common)  # type: ignore[arg-type]
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    se = sd / math.sqrt(n)
    sign = 1.0 if direction == "greater" else -1.0
    excess = sign * (mean - margin)  # > 0: the claimed side of the margin
    t_crit = t_critical(n - 1, alpha) if t_crit is None else t_crit
    if se > 0:
        t = (mean - margin) / se
    else:
        t = math.copysign(math.inf, mean - margin) if mean != margin else math.nan
    if n < MIN_SEEDS:
        verdict = TOO_FEW
    elif excess <= 0:
        verdict = NOT_REPRODUCED
    elif sign * t > t_crit:  # (SE 0: t = ±inf)
        verdict = REPRODUCED
    else:
        verdict = IN_DIRECTION
    return Paired(
        seeds,
        d,
        verdict=verdict,
        mean=mean,
        se=se,
        t=None if math.isnan(t) else t,
        t_crit=t_crit,
        **common,  # type: ignore[arg-type]
    )


# --- shown numbers -----------------------------------------------------------------------------


def t_text(t: float) -> str:
    """A t statistic with 2 decimals, ``+∞``/``−∞`` when SE(d) is 0."""
    return ("+∞" if t > 0 else "−∞") if math.isinf(t) else f"{t:.2f}"


def shown_decimals(se: float | None, mean: float) -> int:
    """Enough decimals to show the standard error to 2 significant digits (2 to 6)."""
    ref = se if se else abs(mean)
    if not ref or not math.isfinite(ref):
        return 2
    return max(2, min(6, 1 - math.floor(math.log10(ref))))
