"""Diurnal availability: each client is online for one window a day, drawn once per client.

A client is eligible for FL only while idle, charging and on an unmetered network (Bonawitz et
al., MLSys 2019, §3), which phones mostly are at night, so the number online follows the day
(ibid. §9: a 4x swing over 24 hours). This model gives client ``i`` one daily window on its own
clock: it opens at local hour ``h_i`` and lasts ``d_i`` of the period (its duty cycle), each
drawn once per client; ``z_i`` hours is how far its clock is ahead of the reference zone. With
``P`` the period in seconds (a day of 24 hours: one hour is ``P / 24``) and ``o`` the reference
zone's time of day at simulated time 0 (``origin_h``; default 0: time 0 is its midnight):

    open_i  = (h_i - z_i - o) * P / 24  mod P     (simulated time, mod P, the window opens)
    len_i   = d_i * P
    online_i(t)     iff  (t - open_i) mod P  <  len_i
    offline_at_i(t) =    t + len_i - ((t - open_i) mod P)   when online; t when offline;
                         inf when d_i = 1 (always online)

A window may run past midnight (``open_i + len_i > P``): the mod takes it into the next day. The
population's expected fraction online, :func:`online_fraction`, is the circular convolution of
the open times' law with the survival of the window length: ``f(t) = E[P(len > (t - open) mod
P)]``. A von Mises start whose ``kappa`` is not given gets the concentration that makes ``max f
/ min f`` equal ``peak_to_trough`` (default 4, Bonawitz et al. §9), solved by bisection
(:func:`resolved_kappa`). Every default, and why the duty cycle and the start hour have none:
docs/diurnal_sources.md.

Pure numpy; :func:`draw` takes its generator's draws in this order: start hours, duty cycles,
offsets (a constant draws nothing).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

PEAK_TO_TROUGH = 4.0  # Bonawitz et al. 2019 §9: "a 4x difference between low and high numbers"
KAPPA_MAX = 1e4  # the most concentrated start the solver tries (circular sd ~2.3 min of a day)
GRID = 4096  # lattice points per period for online_fraction and the solver (~21 s of a day)


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# -- the local hour a client's window opens (circular, [0, 24)) ------------------------------


class StartConstant(_Strict):
    kind: Literal["constant"]
    hour: float = Field(ge=0, lt=24, description="local hour every client's window opens")


class StartUniform(_Strict):
    """Uniform on the arc from ``low_h`` forward to ``high_h``; ``high_h < low_h`` wraps past
    midnight (22 -> 2 is four hours); 0 -> 24 is the whole day."""

    kind: Literal["uniform"]
    low_h: float = Field(ge=0, lt=24)
    high_h: float = Field(gt=0, le=24)

    @model_validator(mode="after")
    def _arc(self) -> StartUniform:
        if self.low_h == self.high_h:
            raise ValueError(
                f"low_h and high_h are both {self.low_h}: an empty arc (allowed: different "
                "hours; kind constant for one hour, low_h 0 and high_h 24 for the whole day)"
            )
        return self

    @property
    def arc_h(self) -> float:
        return (
            self.high_h - self.low_h if self.high_h > self.low_h else self.high_h + 24 - self.low_h
        )


class StartVonMises(_Strict):
    """The angle ``2 pi h / 24`` is von Mises around ``mean_h``: ``kappa`` (0: uniform over the
    day; large: circular sd ~ ``24 / (2 pi sqrt(kappa))`` hours), or, without it, the ``kappa``
    whose population swings ``peak_to_trough`` times over the day."""

    kind: Literal["von_mises"]
    mean_h: float = Field(ge=0, lt=24, description="mean local hour the windows open")
    kappa: float | None = Field(None, ge=0, le=KAPPA_MAX, description="concentration")
    peak_to_trough: float = Field(
        PEAK_TO_TROUGH,
        ge=1,
        description="most / fewest clients online over the day, when kappa is not given "
        "(Bonawitz et al. 2019 §9: 4x for a US-centric population)",
    )

    @model_validator(mode="after")
    def _one_spread(self) -> StartVonMises:
        if self.kappa is not None and "peak_to_trough" in self.model_fields_set:
            raise ValueError(
                f"give kappa ({self.kappa}) or peak_to_trough ({self.peak_to_trough}), not both: "
                "peak_to_trough is solved for kappa"
            )
        return self


Start = Annotated[StartConstant | StartUniform | StartVonMises, Field(discriminator="kind")]


# -- the duty cycle: the fraction of the period a client is online ([0, 1]) -------------------


class DutyConstant(_Strict):
    kind: Literal["constant"]
    value: float = Field(ge=0, le=1, description="fraction of the period online")


class DutyUniform(_Strict):
    kind: Literal["uniform"]
    low: float = Field(ge=0, le=1)
    high: float = Field(ge=0, le=1)

    @model_validator(mode="after")
    def _ordered(self) -> DutyUniform:
        if self.high < self.low:
            raise ValueError(f"high must be >= low (got low={self.low}, high={self.high})")
        return self


class DutyBeta(_Strict):
    """Beta(a, b): mean ``a / (a + b)``; a fraction's analogue of a lognormal."""

    kind: Literal["beta"]
    a: float = Field(gt=0)
    b: float = Field(gt=0)


Duty = Annotated[DutyConstant | DutyUniform | DutyBeta, Field(discriminator="kind")]


# -- a client's time zone: hours its clock is ahead of the reference zone ---------------------


class OffsetConstant(_Strict):
    kind: Literal["constant"]
    hours: float = Field(ge=-24, le=24)


class OffsetUniform(_Strict):
    kind: Literal["uniform"]
    low_h: float = Field(ge=-24, le=24)
    high_h: float = Field(ge=-24, le=24)

    @model_validator(mode="after")
    def _ordered(self) -> OffsetUniform:
        if self.high_h < self.low_h or self.high_h - self.low_h > 24:
            raise ValueError(
                f"low_h {self.low_h}, high_h {self.high_h} (allowed: low_h <= high_h <= low_h + 24)"
            )
        return self


class OffsetChoice(_Strict):
    """One of ``hours``, with probabilities ``weights`` (normalized; null: equal)."""

    kind: Literal["choice"]
    hours: tuple[float, ...] = Field(min_length=1)
    weights: tuple[float, ...] | None = None

    @model_validator(mode="after")
    def _weights(self) -> OffsetChoice:
        bad = [h for h in self.hours if not -24 <= h <= 24]
        if bad:
            raise ValueError(f"hours {bad} (allowed: -24 <= hours <= 24)")
        w = self.weights
        if w is not None and (len(w) != len(self.hours) or min(w) < 0 or sum(w) <= 0):
            raise ValueError(
                f"weights {list(w)} (allowed: one weight >= 0 per hour, {len(self.hours)} of "
                "them, not all 0)"
            )
        return self


Offset = Annotated[OffsetConstant | OffsetUniform | OffsetChoice, Field(discriminator="kind")]


class Diurnal(_Strict):
    """``availability: {kind: diurnal, ...}``: one daily window per client. ``start`` and
    ``duty`` have no default: no published number for them was found (docs/diurnal_sources.md)."""

    kind: Literal["diurnal"]
    period_s: float = Field(86400.0, gt=0, description="seconds in a day (24 local hours)")
    origin_h: float = Field(
        0.0, ge=0, lt=24, description="the reference zone's hour at simulated time 0"
    )
    start: Start = Field(description="local hour each client's window opens")
    duty: Duty = Field(description="fraction of the period each client is online")
    offset: Offset = Field(
        default_factory=lambda: OffsetConstant(kind="constant", hours=0.0),
        description="hours each client's clock is ahead of the reference zone",
    )

    @model_validator(mode="after")
    def _reachable(self) -> Diurnal:
        resolved_kappa(self)  # an unreachable peak_to_trough fails here, naming it
        return self


@dataclass(frozen=True, eq=False)
class DiurnalClients:
    """The drawn windows, index = client. Seconds throughout; ``period_s`` is 24 local hours."""

    period_s: float
    start_s: np.ndarray  # float64 [n], [0, period): local time of day each window opens
    length_s: np.ndarray  # float64 [n], [0, period]: each window's length (duty * period)
    offset_s: np.ndarray  # float64 [n]: how far each client's clock is ahead of the reference
    origin_s: float = 0.0  # the reference zone's time of day at simulated time 0
    open_s: np.ndarray = field(init=False)  # float64 [n], [0, period): opening, simulated, mod P

    def __post_init__(self) -> None:
        arrays = [
            np.asarray(a, dtype=np.float64) for a in (self.start_s, self.length_s, self.offset_s)
        ]
        if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 1:
            raise ValueError("DiurnalClients: start_s, length_s, offset_s need one 1-D shape")
        ok = all(np.isfinite(a).all() for a in arrays) and math.isfinite(self.origin_s)
        if not (
            ok and self.period_s > 0 and np.all((arrays[1] >= 0) & (arrays[1] <= self.period_s))
        ):
            raise ValueError(
                "DiurnalClients: need finite values, period_s > 0 and 0 <= length_s <= period_s"
            )
        start, length, offset = arrays
        object.__setattr__(self, "start_s", start)
        object.__setattr__(self, "length_s", length)
        object.__setattr__(self, "offset_s", offset)
        object.__setattr__(self, "open_s", _wrap(start - offset - self.origin_s, self.period_s))

    def __len__(self) -> int:
        return len(self.start_s)

    @property
    def duty(self) -> np.ndarray:
        """float64 [n]: each client's fraction of the period online."""
        return self.length_s / self.period_s

    def online_mask(self, clients: np.ndarray, at_s: float) -> np.ndarray:
        """bool [len(clients)]: which of ``clients`` (int ids) are online at ``at_s``."""
        c = np.asarray(clients, dtype=np.intp)
        into = _wrap(float(at_s) - self.open_s[c], self.period_s)  # seconds since it opened
        return (into < self.length_s[c]) | (self.length_s[c] >= self.period_s)

    def offline_at(self, client: int, at_s: float) -> float:
        """The simulated time ``client``'s current window ends (it is online on ``[at_s, end)``):
        ``inf`` if it is always online, ``at_s`` itself if it is offline at ``at_s``."""
        length = float(self.length_s[client])
        if length >= self.period_s:
            return math.inf
        into = float(_wrap(float(at_s) - self.open_s[client], self.period_s))
        return float(at_s) + (length - into) if into < length else float(at_s)


def draw(cfg: Diurnal, n: int, rng: np.random.Generator) -> DiurnalClients:
    """``n`` clients' windows: start hours, then duty cycles, then offsets, from ``rng``."""
    if n < 0:
        raise ValueError(f"n must be >= 0 (got {n})")
    hour_s = cfg.period_s / 24
    start_h = _draw_start(cfg.start, resolved_kappa(cfg), n, rng)
    duty = _draw_duty(cfg.duty, n, rng)
    offset_h = _draw_offset(cfg.offset, n, rng)
    return DiurnalClients(
        period_s=cfg.period_s,
        start_s=_wrap(start_h * hour_s, cfg.period_s),
        length_s=duty * cfg.period_s,
        offset_s=offset_h * hour_s,
        origin_s=cfg.origin_h * hour_s,
    )


def _draw_start(start: Start, kappa: float | None, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(start, StartConstant):
        return np.full(n, start.hour)
    if isinstance(start, StartUniform):
        return np.mod(start.low_h + rng.random(n) * start.arc_h, 24.0)
    assert kappa is not None
    return np.mod(start.mean_h + rng.vonmises(0.0, kappa, n) * 24 / (2 * math.pi), 24.0)


def _draw_duty(duty: Duty, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(duty, DutyConstant):
        return np.full(n, duty.value)
    if isinstance(duty, DutyUniform):
        return rng.uniform(duty.low, duty.high, n)
    return rng.beta(duty.a, duty.b, n)


def _draw_offset(offset: Offset, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(offset, OffsetConstant):
        return np.full(n, offset.hours)
    if isinstance(offset, OffsetUniform):
        return rng.uniform(offset.low_h, offset.high_h, n)
    hours = np.asarray(offset.hours, dtype=np.float64)
    p = None if offset.weights is None else np.asarray(offset.weights) / sum(offset.weights)
    return hours[rng.choice(len(hours), size=n, p=p)]


# -- the population's law: the expected fraction online over the day --------------------------


def online_fraction(cfg: Diurnal, at_s: np.ndarray) -> np.ndarray:
    """float64 [len(at_s)]: the expected fraction of clients online at each simulated time (the
    law :func:`draw` samples; on a lattice of ``GRID`` points a period, interpolated)."""
    f = _fraction_grid(cfg.start, resolved_kappa(cfg), _kernel(cfg))
    x = _wrap(np.asarray(at_s, dtype=np.float64), cfg.period_s) * (GRID / cfg.period_s)
    return np.asarray(np.interp(x, np.arange(GRID + 1), np.append(f, f[0])), dtype=np.float64)


def resolved_kappa(cfg: Diurnal) -> float | None:
    """The von Mises start's concentration: as given, or solved from ``peak_to_trough`` (None
    for other starts). Raises ValueError, naming the field, if the ratio cannot be reached."""
    start = cfg.start
    if not isinstance(start, StartVonMises):
        return None
    if start.kappa is not None:
        return start.kappa
    target, kernel = start.peak_to_trough, _kernel(cfg)

    def ratio(kappa: float) -> float:  # most / fewest online over the day
        f = _fraction_grid(start, kappa, kernel)
        return math.inf if f.min() <= 1e-12 else float(f.max() / f.min())

    most = ratio(KAPPA_MAX)
    if most < target:
        raise ValueError(
            f"start.peak_to_trough {target} cannot be reached: with these duty cycles and "
            f"offsets the most / fewest online over the day is at most {most:.4g} (kappa "
            f"{KAPPA_MAX:g}); allowed: 1 <= peak_to_trough <= that, or give start.kappa"
        )
    lo, hi = -12.0, math.log(KAPPA_MAX)  # bisection on log kappa: the ratio grows with kappa
    if ratio(math.exp(lo)) >= target:
        return 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ratio(math.exp(mid)) < target else (lo, mid)
    return math.exp(hi)


def _kernel(cfg: Diurnal) -> np.ndarray:
    """complex [GRID // 2 + 1]: the spectrum of what the start's law is convolved with: the law
    of ``-offset - origin`` (lattice units) and the window length's survival ``P(len > age)``."""
    m = GRID
    minus_offset = np.roll(_offset_mass(cfg.offset)[::-1], 1)  # the law of -offset
    survival = _duty_survival(cfg.duty, np.arange(m) / m)  # P(duty > age / period)
    parts = (minus_offset, _point(-cfg.origin_h / 24 * m), survival)
    return np.asarray(np.prod([np.fft.rfft(p) for p in parts], axis=0))


def _fraction_grid(start: Start, kappa: float | None, kernel: np.ndarray) -> np.ndarray:
    """float64 [GRID]: the expected fraction online at lattice times ``k * period / GRID``: the
    open times' law (start - offset - origin) circularly convolved with the length's survival,
    ``f[k] = sum_j P(open = j) P(len > (k - j) mod GRID)``."""
    f = np.fft.irfft(np.fft.rfft(_start_mass(start, kappa)) * kernel, n=GRID)
    return np.asarray(np.clip(f, 0.0, 1.0), dtype=np.float64)


def _point(x: float) -> np.ndarray:
    """[GRID]: unit mass at lattice coordinate ``x`` (mod GRID), split between its neighbours."""
    x = float(np.mod(x, GRID))
    k = math.floor(x)
    out = np.zeros(GRID)
    out[k % GRID] += 1 - (x - k)
    out[(k + 1) % GRID] += x - k
    return out


def _arc(lo: float, length: float) -> np.ndarray:
    """[GRID]: unit mass spread uniformly on ``[lo, lo + length)`` (lattice units, wrapping);
    point ``k`` takes the part of the arc within ``[k - 1/2, k + 1/2)``."""
    lo = float(np.mod(lo, GRID))
    edges = np.arange(2 * GRID + 1) - 0.5
    overlap = np.clip(np.minimum(edges[1:], lo + length) - np.maximum(edges[:-1], lo), 0, None)
    folded = overlap[:GRID] + overlap[GRID:]
    folded[0] += max(0.0, min(lo + length, 2 * GRID + 0.5) - (2 * GRID - 0.5))
    return np.asarray(folded / folded.sum(), dtype=np.float64)


def _start_mass(start: Start, kappa: float | None) -> np.ndarray:
    scale = GRID / 24  # lattice points per hour
    if isinstance(start, StartConstant):
        return _point(start.hour * scale)
    if isinstance(start, StartUniform):
        return _arc(start.low_h * scale, start.arc_h * scale)
    assert kappa is not None
    theta = 2 * math.pi * np.arange(GRID) / GRID
    w = np.exp(kappa * (np.cos(theta - 2 * math.pi * start.mean_h / 24) - 1))
    return np.asarray(w / w.sum(), dtype=np.float64)


def _offset_mass(offset: Offset) -> np.ndarray:
    scale = GRID / 24
    if isinstance(offset, OffsetConstant):
        return _point(offset.hours * scale)
    if isinstance(offset, OffsetUniform):
        if offset.high_h == offset.low_h:
            return _point(offset.low_h * scale)
        return _arc(offset.low_h * scale, (offset.high_h - offset.low_h) * scale)
    w = np.ones(len(offset.hours)) if offset.weights is None else np.asarray(offset.weights)
    out = np.zeros(GRID)
    for wi, h in zip(w / w.sum(), offset.hours, strict=True):
        out += wi * _point(h * scale)
    return out


def _duty_survival(duty: Duty, x: np.ndarray) -> np.ndarray:
    """float64 [len(x)]: ``P(duty > x)`` for ``x`` in [0, 1)."""
    if isinstance(duty, DutyConstant):
        return (duty.value > x).astype(np.float64)
    if isinstance(duty, DutyUniform):
        if duty.high == duty.low:
            return (duty.low > x).astype(np.float64)
        return np.clip((duty.high - x) / (duty.high - duty.low), 0.0, 1.0)
    return 1.0 - _beta_cdf(duty.a, duty.b, x)


def _beta_cdf(a: float, b: float, x: np.ndarray, cells: int = 1 << 16) -> np.ndarray:
    """Beta(a, b)'s CDF at ``x``, by cell masses that integrate the endpoint singularities
    exactly: on ``[0, 1/2]`` a cell holds ``(1 - x_mid)^(b-1) (x1^a - x0^a) / a``, on ``[1/2, 1]``
    ``x_mid^(a-1) ((1 - x0)^b - (1 - x1)^b) / b``; normalized."""
    e = np.linspace(0.0, 1.0, cells + 1)
    x0, x1 = e[:-1], e[1:]
    mid = (x0 + x1) / 2
    left = (1 - mid) ** (b - 1) * (x1**a - x0**a) / a
    right = mid ** (a - 1) * ((1 - x0) ** b - (1 - x1) ** b) / b
    mass = np.where(mid < 0.5, left, right)
    cdf = np.concatenate([[0.0], np.cumsum(mass)])
    return np.asarray(np.interp(x, e, cdf / cdf[-1]), dtype=np.float64)


def _wrap(x: np.ndarray | float, period: float) -> np.ndarray:
    """``x mod period`` in ``[0, period)`` (np.mod can round a tiny negative up to ``period``)."""
    out = np.mod(np.asarray(x, dtype=np.float64), period)
    return np.where(out >= period, 0.0, out)
