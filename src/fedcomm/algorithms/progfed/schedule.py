"""ProgFed's stage schedule and client learning rate (Wang et al., ICML 2022, §3.1, Algorithm 1).

Schedule over ``T`` scheduled rounds and ``S`` stages: ``T_s = ⌊T/(2S)⌋`` rounds for each
``s < S`` and the rest, ``T − (S−1)·T_s``, for the full model. Before every stage ``s ≥ 2``
come ``W`` **extra** warm-up rounds (not counted in T: the loop runs ``T + (S−1)·W`` rounds)
that repeat the last scheduled round ``t`` and run at the base learning rate.

The client rate of scheduled round ``t`` is the official code's cosine
``lr_t = max(η0·(1 + cos(π(t−1)/(T−1)))/2, min_lr)``, not reset at stage changes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar

T = TypeVar("T")
LrSchedule = Literal["cosine", "constant"]


@dataclass(frozen=True)
class Phase:
    """What one loop round does: the stage, whether it is a warm-up round, and the scheduled
    round ``t`` (1-based; warm-up rounds repeat the last scheduled round and use the base lr)."""

    stage: int
    warmup: bool
    t: int


def stage_length(rounds: int, stages: int) -> int:
    """``T_s = ⌊T/(2S)⌋``, the rounds of each stage ``s < S`` (Algorithm 1, line 5; ``T`` for
    ``S = 1``)."""
    ts = rounds // (2 * stages) if stages > 1 else rounds
    if ts < 1:
        raise ValueError(f"rounds={rounds} is too short for {stages} stages (T/(2S) < 1)")
    return ts


def schedule(rounds: int, stages: int, warmup: int) -> list[Phase]:
    """The phase of every loop round (index ``r − 1``): ``rounds + (stages − 1)·warmup`` long."""
    ts = stage_length(rounds, stages)
    out: list[Phase] = []
    t = 0
    for s in range(1, stages + 1):
        if s > 1:
            out += [Phase(s, True, max(t, 1))] * warmup
        length = ts if s < stages else rounds - (stages - 1) * ts
        for _ in range(length):
            t += 1
            out.append(Phase(s, False, t))
    return out


def at_round(per_round: Sequence[T], round_: int) -> T:
    """The entry of loop round ``round_`` (1-based) in a per-round list, clamped to the
    schedule (round 0 reads round 1's, a round past the end the last one's)."""
    return per_round[min(max(round_, 1), len(per_round)) - 1]


def warmup_index(phases: Sequence[Phase]) -> list[int]:
    """For each loop round, its position ``w = 1…W`` within its stage's warm-up rounds (0 for a
    stage round)."""
    out: list[int] = []
    w = 0
    prev: Phase | None = None
    for ph in phases:
        w = w + 1 if prev is not None and prev.warmup and prev.stage == ph.stage else 1
        out.append(w if ph.warmup else 0)
        prev = ph
    return out


def cosine_lr(base: float, t: int, rounds: int, floor: float) -> float:
    """The code's per-round client rate ``max(η0·(1 + cos(π(t−1)/(T−1)))/2, floor)``."""
    if rounds <= 1:
        return max(base, floor)
    return max(base * (1 + math.cos(math.pi * (t - 1) / (rounds - 1))) / 2, floor)


def lr_factor(ph: Phase, rounds: int, lr_schedule: LrSchedule) -> float:
    """The round's client lr over the base lr (warm-up rounds: the base lr)."""
    if ph.warmup or lr_schedule == "constant":
        return 1.0
    return cosine_lr(1.0, ph.t, rounds, 0.0)


def client_lr(base: float, factor: float, floor: float) -> float:
    """``max(η0·factor, floor)``; the base rate itself when ``factor`` is 1 (no floor)."""
    if factor != 1.0:
        return max(base * factor, floor)
    return base
