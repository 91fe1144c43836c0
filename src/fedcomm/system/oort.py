"""Oort's participant selection: statistical utility times a penalty for slow clients, with
exploration and a pacer (Lai et al., "Oort: Efficient Federated Learning via Guided Participant
Selection", OSDI 2021, Sec. 4; the FedScale implementation ``thirdparty/oort/oort.py`` and its
defaults in ``fedscale/core/config_parser.py``).

Client ``i``'s utility after it took part (Oort's Eq. 2, with FedScale's normalisation):

    U_i = (clip(R_i) - R_min) / (R_max - R_min) + sqrt(0.1 ln r / r_i)      (r_i: its last round)
    U_i <- U_i (T / t_i)^α      if t_i > T                                  (t_i: its duration)

where ``R_i = |B_i| sqrt(mean_k ℓ_k²)`` is its statistical utility (here ``n_i`` times its last
mean training loss: the loop keeps no per-example losses, so the mean loss stands in for their
root mean square), the clip at the ``clip_bound`` quantile of the rewards, ``T`` the preferred
round duration: the ``round_threshold`` percentile of the clients' durations (the pacer raises it
by ``pacer_delta`` when the exploited utility of the last ``pacer_step`` rounds is flat, lowers
it when it changes sharply), ``α = round_penalty``. A round of ``K`` takes ``ε K`` clients never
explored (ε from ``exploration_factor``, times ``exploration_decay`` a round, at least
``exploration_min``), the ``sample_window ε K`` most promising of them by their expected size
and penalised expected duration, drawn in proportion to that; and the rest among the explored,
above ``cut_off_util`` times the ``(1 - ε)K``-th utility (at least ten times as many
candidates), drawn in proportion to utility. Every draw comes from the run's seed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class OortConfig(BaseModel):
    """``system.policy.selection: {kind: oort, ...}`` (defaults: FedScale's config_parser)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["oort"]
    exploration_factor: float = Field(0.9, ge=0, le=1, description="ε at round 1")
    exploration_decay: float = Field(0.98, gt=0, le=1, description="ε's factor a round")
    exploration_min: float = Field(0.3, ge=0, le=1, description="ε's floor")
    round_threshold: float = Field(
        30.0, gt=0, le=100, description="T: this percentile of the clients' durations"
    )
    round_penalty: float = Field(2.0, ge=0, description="α: utility times (T / t)^α if t > T")
    clip_bound: float = Field(0.9, gt=0, le=1, description="rewards clipped at this quantile")
    cut_off_util: float = Field(
        0.05, ge=0, le=1, description="exploited candidates above this times the K-th utility"
    )
    pacer_step: int = Field(20, ge=1, description="rounds per pacer window")
    pacer_delta: float = Field(5.0, ge=0, description="percentile points the pacer moves T")
    sample_window: float = Field(
        5.0, ge=1, description="explored among this many times the slots, the most promising"
    )


@dataclass
class Arms:
    """What Oort knows of every client (index = client id); saved with the run."""

    reward: np.ndarray  # float64 [clients]: R_i (unexplored: its expected size)
    duration: np.ndarray  # float64 [clients] seconds: measured (unexplored: expected)
    last_round: np.ndarray  # int64 [clients]: the round it last took part in (0: never)
    exploration: float
    round_threshold: float
    exploited_utility: list[float] = field(default_factory=list)  # per round, the pacer's
    exploited: list[int] = field(default_factory=list)  # the last round's exploited clients

    @classmethod
    def start(cls, cfg: OortConfig, sizes: np.ndarray, expected_s: np.ndarray) -> Arms:
        """Every client unexplored: its reward its expected size, its duration expected."""
        n = len(sizes)
        return cls(
            np.asarray(sizes, dtype=np.float64).copy(),
            np.asarray(expected_s, dtype=np.float64).copy(),
            np.zeros(n, dtype=np.int64),
            cfg.exploration_factor,
            cfg.round_threshold,
        )

    def update(self, client: int, reward: float, duration_s: float, round_: int) -> None:
        """A client that took part in ``round_`` (aggregated): its utility and duration."""
        self.reward[client] = reward
        self.duration[client] = duration_s
        self.last_round[client] = round_


def select(
    cfg: OortConfig, arms: Arms, online: Sequence[int], k: int, round_: int,
    rng: np.random.Generator, *, first: bool = True,
) -> list[int]:  # fmt: skip
    """``k`` clients among ``online`` for round ``round_`` (sorted); the round's ``first``
    selection moves the pacer and decays ε (an asynchronous server selects again during it)."""
    online = sorted(online)
    if first:
        _pace(cfg, arms, round_)
        arms.exploration = max(arms.exploration * cfg.exploration_decay, cfg.exploration_min)
    if len(online) <= k:
        return online
    t_pref = _preferred(arms)
    explored = [c for c in online if arms.last_round[c] > 0]
    fresh = [c for c in online if arms.last_round[c] == 0]
    n_exploit = min(k - int(k * arms.exploration), len(explored))
    exploit = _exploit(cfg, arms, explored, n_exploit, round_, t_pref, rng)
    n_explore = min(len(fresh), k - len(exploit))
    explore = _explore(cfg, arms, fresh, n_explore, t_pref, rng)
    chosen = set(exploit) | set(explore)
    if len(chosen) < k:  # not enough fresh clients: the best remaining explored ones
        rest = [c for c in explored if c not in chosen]
        scores = _scores(cfg, arms, rest, round_, t_pref)
        chosen |= set(sorted(rest, key=lambda c: (-scores[c], c))[: k - len(chosen)])
    arms.exploited = sorted(set(arms.exploited) | set(exploit)) if not first else sorted(exploit)
    return sorted(chosen)


def _preferred(arms: Arms) -> float:
    """T: the pacer's percentile of every client's duration (inf at 100)."""
    if arms.round_threshold >= 100:
        return math.inf
    d = np.sort(arms.duration)
    return float(d[min(int(len(d) * arms.round_threshold / 100.0), len(d) - 1)])


def _scores(
    cfg: OortConfig, arms: Arms, clients: Sequence[int], round_: int, t_pref: float
) -> dict[int, float]:
    """``U_i`` of explored clients (module doc)."""
    if not clients:
        return {}
    rewards = np.sort(arms.reward[list(clients)])
    clip = float(rewards[min(int(len(rewards) * cfg.clip_bound), len(rewards) - 1)])
    low = float(rewards[0]) * 0.999
    span = max(float(rewards[-1]) - low, 1e-4)
    out = {}
    for c in clients:
        u = (min(float(arms.reward[c]), clip) - low) / span
        u += math.sqrt(0.1 * math.log(max(round_, 1)) / float(arms.last_round[c]))
        out[c] = abs(u * _penalty(cfg, float(arms.duration[c]), t_pref))
    return out


def _penalty(cfg: OortConfig, duration_s: float, t_pref: float) -> float:
    if duration_s <= t_pref:
        return 1.0
    return float((t_pref / max(duration_s, 1e-4)) ** cfg.round_penalty)


def _exploit(
    cfg: OortConfig, arms: Arms, explored: list[int], n: int, round_: int, t_pref: float,
    rng: np.random.Generator,
) -> list[int]:  # fmt: skip
    """``n`` explored clients drawn in proportion to utility among those above the cut-off."""
    if n <= 0:
        return []
    scores = _scores(cfg, arms, explored, round_, t_pref)
    ranked = sorted(explored, key=lambda c: (-scores[c], c))
    cut = scores[ranked[min(n, len(ranked) - 1)]] * cfg.cut_off_util
    pool = [c for i, c in enumerate(ranked) if scores[c] >= cut or i <= 10 * n]
    p = np.array([scores[c] for c in pool])
    p = p / p.sum() if p.sum() > 0 else np.full(len(pool), 1.0 / len(pool))
    return [int(pool[i]) for i in rng.choice(len(pool), size=n, replace=False, p=p)]


def _explore(
    cfg: OortConfig, arms: Arms, fresh: list[int], n: int, t_pref: float,
    rng: np.random.Generator,
) -> list[int]:  # fmt: skip
    """``n`` never-explored clients: the ``sample_window n`` most promising by expected size and
    penalised expected duration, drawn in proportion to that."""
    if n <= 0:
        return []
    prior = {c: float(arms.reward[c]) * _penalty(cfg, float(arms.duration[c]), t_pref)
             for c in fresh}  # fmt: skip
    window = sorted(fresh, key=lambda c: (-prior[c], c))[: max(n, int(cfg.sample_window * n))]
    p = np.array([prior[c] for c in window])
    p = p / p.sum() if p.sum() > 0 else np.full(len(window), 1.0 / len(window))
    return [int(window[i]) for i in rng.choice(len(window), size=n, replace=False, p=p)]


def _pace(cfg: OortConfig, arms: Arms, round_: int) -> None:
    """The pacer: the last round's exploited utility recorded; every ``pacer_step`` rounds T's
    percentile moves up when the utility went flat (within 10%), down when it changed 5x."""
    got = [float(arms.reward[c]) for c in arms.exploited if arms.last_round[c] == round_ - 1]
    arms.exploited_utility.append(sum(got) / (len(got) + 1e-4))
    step = cfg.pacer_step
    if round_ >= 2 * step and round_ % step == 0:
        before = sum(arms.exploited_utility[-2 * step : -step])
        now = sum(arms.exploited_utility[-step:])
        if abs(now - before) <= before * 0.1:
            arms.round_threshold = min(100.0, arms.round_threshold + cfg.pacer_delta)
        elif abs(now - before) >= before * 5:
            arms.round_threshold = max(cfg.pacer_delta, arms.round_threshold - cfg.pacer_delta)
