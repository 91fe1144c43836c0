"""A client's joules per round, from the bits its messages encoded and the FLOPs it computed.

Under ``system.energy`` each client's part of a round (its :class:`~.clock.ClientTime`: latency,
downlink, compute, latency, uplink, in seconds from the round's start) is charged:

    down    = j_per_bit_down · down_bits + active_w · down_s   (+ its radio's tail)
    compute = J/FLOP · work_flops
    up      = j_per_bit_up · up_bits + active_w · up_s         (+ its radio's tail)

with the radio of each direction's link technology (:mod:`.radios`: Huang et al.'s data-transfer
power model, ARO's numbers) and the client's J/FLOP (a constant, or ``watts`` over the client's
FLOP/s: a faster phone at the same power spends less per FLOP). The tail after the downlink is
cut where the uplink starts when both go over the same technology (one radio); after the uplink it
runs whole. The bits are those the ledger counts as encoded, the seconds those the clock timed.

A client that stopped before it finished (``stop_s``: a straggler dropped when the round closed)
is charged what it did until then: each phase in proportion to its seconds before ``stop_s``
(bits and FLOPs alike: exact for a constant link; a trace link's bits are apportioned by time),
and the tail after the last transfer it was on. What the ledger records of a cut uplink
(``cut_uplink``: ``not_sent`` or ``partial``) does not change it: the radio sent what it sent.

Each client's radio: its direction's ``energy.links`` technology, or (``auto``) the technology
of the trace it drew: Mahimahi's traces name theirs (LTE, UMTS, EVDO), 5Gophers' are 5G.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from fedcomm.errors import InputError
from fedcomm.seeding import Stream, numpy_rng
from fedcomm.system import traces
from fedcomm.system.clock import Capacity, ClientTime
from fedcomm.system.config import JoulesPerFlop, RadioEnergy, SystemConfig, TraceLink
from fedcomm.system.population import TRACE_DOWN, TRACE_UP, Population
from fedcomm.system.radios import SOURCED, Radio

# the round metrics (joules; every client sampled in the round, dropped ones included)
ROUND_J = "energy/round_j"
DOWN_J = "energy/down_j"
COMPUTE_J = "energy/compute_j"
UP_J = "energy/up_j"
DROPPED_J = "energy/dropped_j"  # the part spent by clients that were not aggregated
CUM_J = "energy/cum_j"  # since the run began


@dataclass(frozen=True)
class EnergyModel:
    """A run's per-client energy parameters, fixed for the run (index = client id)."""

    down: tuple[Radio, ...]  # the radio of each client's downlink
    up: tuple[Radio, ...]
    down_tech: tuple[str, ...]  # their technologies (one radio when the two are the same)
    up_tech: tuple[str, ...]
    j_per_flop: np.ndarray  # float64 [clients], J per FLOP of local work
    tails: bool


@dataclass(frozen=True)
class ClientEnergy:
    """One client's joules in one round."""

    down_j: float
    compute_j: float
    up_j: float

    @property
    def total_j(self) -> float:
        return self.down_j + self.compute_j + self.up_j

    def row(self) -> dict[str, float]:
        """Its columns in the client's row."""
        return {
            "energy_down_j": self.down_j,
            "energy_compute_j": self.compute_j,
            "energy_up_j": self.up_j,
            "energy_j": self.total_j,
        }


def _radio(cfg: SystemConfig, tech: str) -> Radio:
    """``tech``'s numbers: the user's (``energy.radios``), else the sourced ones."""
    assert cfg.energy is not None
    given: RadioEnergy | None = cfg.energy.radios.get(tech)  # type: ignore[call-overload]
    if given is not None:
        tail = tuple((s.seconds, s.watts) for s in given.tail)
        return Radio(given.down_j_per_bit, given.up_j_per_bit, given.active_w, tail)
    return SOURCED[tech]


def build(cfg: SystemConfig, population: Population, seed: int, root: Path | None) -> EnergyModel:
    """The run's energy parameters (``cfg.energy`` set) for the clients of ``population``
    (drawn from ``seed``; ``root``: the data root, where a trace link's technologies are read)."""
    assert cfg.energy is not None
    n = population.size
    techs = {
        d: _techs(cfg, d, population.down if d == "down" else population.up, seed, root)
        for d in ("down", "up")
    }
    radios = {t: _radio(cfg, t) for d in techs for t in sorted(set(techs[d]))}
    compute = cfg.energy.compute
    assert compute is not None  # (EnergyConfig refuses None)
    if isinstance(compute, JoulesPerFlop):
        j_per_flop = np.full(n, float(compute.j_per_flop))
    else:  # W over FLOP/s: J per FLOP
        j_per_flop = float(compute.watts) / population.flops_per_s
    return EnergyModel(
        down=tuple(radios[t] for t in techs["down"]),
        up=tuple(radios[t] for t in techs["up"]),
        down_tech=tuple(techs["down"]),
        up_tech=tuple(techs["up"]),
        j_per_flop=j_per_flop,
        tails=cfg.energy.tails,
    )


def _techs(
    cfg: SystemConfig,
    direction: Literal["down", "up"],
    caps: Sequence[Capacity],
    seed: int,
    root: Path | None,
) -> list[str]:
    """Each client's technology for ``direction``."""
    assert cfg.energy is not None
    tech = getattr(cfg.energy.links, direction)
    if tech != "auto":
        return [tech] * len(caps)
    link = getattr(cfg.links, direction)
    assert isinstance(link, TraceLink)  # (SystemConfig refuses auto on another link)
    if link.source == "fivegophers":
        return ["5g"] * len(caps)
    assert root is not None  # (the population read its traces there)
    found = traces.link_traces(root, "mahimahi", direction)
    named = traces.mahimahi_technologies(root, direction)
    given = cfg.energy.radios
    missing = sorted({named[t.name] for t in found} - set(given) - set(SOURCED))
    if missing:
        names = ", ".join(t.name for t in found if named[t.name] in missing)
        raise InputError(
            f"system.energy.radios.{missing[0]} must be set: links.{direction} draws Mahimahi's "
            f"{', '.join(m.upper() for m in missing)} traces ({names}) and fedcomm has no sourced "
            f"{', '.join(missing)} energy (docs/system.md, Energy); or set "
            f"energy.links.{direction} to one technology for every client"
        )
    # the population's own draw of each client's trace (population.py: the first draw of its
    # stream), checked against the capacity the client got
    key = TRACE_DOWN if direction == "down" else TRACE_UP
    pick = numpy_rng(seed, Stream.SYSTEM, 0, key).integers(0, len(found), len(caps))
    for cid, (cap, i) in enumerate(zip(caps, pick, strict=True)):
        if not _drawn_from(cap.mbps, found[int(i)].mbps, link.window_s):
            raise RuntimeError(
                f"system.energy: client {cid}'s {direction}link is not the trace "
                f"{found[int(i)].name} the population's draw gives it: the energy model no "
                "longer follows system/population.py's trace draw"
            )
    return [named[found[int(i)].name] for i in pick]


def _drawn_from(mbps: np.ndarray, trace: np.ndarray, window_s: int | None) -> bool:
    """Whether a client's capacity (``mbps``) is ``trace``: whole, or a window of it (cyclic)."""
    if window_s is None:
        return bool(np.array_equal(mbps, trace))
    w = len(mbps)
    if w != min(window_s, len(trace)):
        return False
    doubled = np.concatenate([trace, trace])
    return any(
        np.array_equal(doubled[s : s + w], mbps)
        for s in np.flatnonzero(trace == mbps[0])  # candidate starts
    )


def _done(start_s: float, seconds: float, stop_s: float) -> float:
    """The share of a phase (from ``start_s``, ``seconds`` long) done by ``stop_s``."""
    if math.isinf(stop_s):
        return 1.0
    if seconds <= 0:
        return 1.0 if start_s <= stop_s else 0.0
    return min(1.0, max(0.0, (stop_s - start_s) / seconds))


def client_energy(
    model: EnergyModel,
    time: ClientTime,
    *,
    down_bits: float,
    work_flops: float,
    up_bits: float,
    stop_s: float | None = None,
) -> ClientEnergy:
    """The joules of one client's round as the clock timed it (``time``; seconds from the
    round's start): its ``down_bits`` downlink, ``work_flops`` of local work, ``up_bits``
    uplink; ``stop_s``: the client stopped then (a dropped straggler, at the round's close),
    charged for what it did until then. None: it finished."""
    cid = time.client_id
    d, u = model.down[cid], model.up[cid]
    stop = math.inf if stop_s is None else stop_s
    down_at = time.latency_s
    f_down = _done(down_at, time.down_s, stop)
    f_work = _done(down_at + time.down_s, time.compute_s, stop)
    f_up = _done(time.up_start_s, time.up_s, stop)
    down_j = f_down * (d.down_j_per_bit * down_bits + d.active_w * time.down_s)
    compute_j = f_work * work_flops * float(model.j_per_flop[cid])
    up_j = f_up * (u.up_j_per_bit * up_bits + u.active_w * time.up_s)
    if model.tails:
        if f_down > 0:  # cut by the uplink when it goes over the same radio and starts
            one_radio = model.down_tech[cid] == model.up_tech[cid]
            room = time.compute_s + time.latency_s if one_radio and f_up > 0 else math.inf
            down_j += d.tail_j(room)
        if f_up > 0:
            up_j += u.tail_j(math.inf)
    return ClientEnergy(down_j, compute_j, up_j)


@dataclass(frozen=True)
class RoundEnergy:
    """A round's joules: the sums over its sampled clients, and the run's before it."""

    round_j: float
    down_j: float
    compute_j: float
    up_j: float
    dropped_j: float
    before_j: float  # the run's joules before this round

    def metrics(self) -> dict[str, float | None]:
        """The round's ``energy/*`` metrics."""
        return {
            ROUND_J: self.round_j,
            DOWN_J: self.down_j,
            COMPUTE_J: self.compute_j,
            UP_J: self.up_j,
            DROPPED_J: self.dropped_j,
            CUM_J: self.before_j + self.round_j,
        }


def round_energy(charged: Sequence[tuple[ClientEnergy, bool]], before_j: float) -> RoundEnergy:
    """The round of ``charged`` clients (each with whether it was dropped), after ``before_j``
    joules of earlier rounds."""
    return RoundEnergy(
        round_j=sum((e.total_j for e, _ in charged), 0.0),
        down_j=sum((e.down_j for e, _ in charged), 0.0),
        compute_j=sum((e.compute_j for e, _ in charged), 0.0),
        up_j=sum((e.up_j for e, _ in charged), 0.0),
        dropped_j=sum((e.total_j for e, dropped in charged if dropped), 0.0),
        before_j=before_j,
    )


def spent_j(round_rows: Sequence[Mapping[str, Any]]) -> float:
    """The run's joules so far (``energy/cum_j`` of its last round; 0 before round 1)."""
    if not round_rows:
        return 0.0
    return float(round_rows[-1].get(CUM_J) or 0.0)
