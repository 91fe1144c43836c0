"""Asynchronous aggregation on the simulated clock: FedBuff and FedAsync.

Under ``train.system.policy.aggregation: fedbuff | fedasync`` the server keeps up to
``concurrency`` clients training at once, each on the global model of the moment it started
(its *version*: the server steps before its start), and steps whenever ``K`` of them have
arrived (FedBuff's buffer, Nguyen et al., AISTATS 2022; FedAsync, Xie et al. 2019: ``K = 1``).
A loop round is one server step: round ``r`` turns version ``r - 1`` into ``r``. Per round:

1. the free slots are filled (round ``r``'s start): idle clients drawn among the online ones
   (the synchronous round's draws, :mod:`fedcomm.system.population`), each trained and encoded
   at once on version ``r - 1`` (its downlink charged to round ``r``) and timed from its bits
   and work as a synchronous client is (:func:`fedcomm.simulation.timed.time_turn`), from its
   own start;
2. events in simulated time: at each instant, the clients whose upload arrives then (by client
   id) fill the buffer, and those past ``deadline_s`` since their start (a client's time limit)
   are dropped, their uplink cut as ``cut_uplink`` says; when the buffer holds ``K`` the round
   closes at that instant (arrivals of the same instant beyond ``K`` wait for the next round);
   otherwise the freed slots are filled at that instant, on version ``r - 1``, and time goes on.
   A client starts at most once a round (its generator is the round's: ``(seed, CLIENT, r,
   client)``); with nobody in flight and nobody to start, the server waits ``idle_s``;
3. the buffer's uplinks are charged to round ``r`` (the ledger's ``version`` column: the model
   each trained on) and taken (decoded, evaluated, stored) in arrival order, then weighed by
   their staleness ``τ = (r - 1) - version`` through ``s(τ)`` (``policy.staleness``):

   - FedBuff: ``Δ_k <- s(τ_k) Δ_k``, then the algorithm's own server step (its weighted mean of
     the deltas and its server optimizer: ``w <- w + η_g Σ_k n_k s(τ_k) Δ_k / Σ_k n_k``);
   - FedAsync: ``Δ <- α s(τ) (w_v + Δ - w)``, the arrival re-based on the current model ``w``,
     so that with a plain server step ``w <- (1 - α s(τ)) w + α s(τ) w_client``.

With ``concurrency = K`` = the round's clients and every client finishing at the same instant,
each round starts the synchronous round's cohort on the same model and aggregates it whole at
staleness 0: the synchronous run, number for number. Only algorithms whose uplink is a delta
from the global model, averaged by the server (``Execution.delta_uplink``), run here; the loop
refuses the others by name (:func:`refuse`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedcomm.algorithms.core import FedAlgorithm, Uplink
from fedcomm.errors import InputError
from fedcomm.simulation.backends import Turn
from fedcomm.simulation.rounds import Encoded, Round
from fedcomm.simulation.synchronous import sent_by
from fedcomm.simulation.timed import SystemRun, Timed, charge, client_row, fitted, reports
from fedcomm.system import energy, selection
from fedcomm.system.config import (
    ConstantStaleness,
    HingeStaleness,
    PolicyConfig,
    PolynomialStaleness,
)
from fedcomm.types import ParamDict

MAX_IDLE = 100_000  # idle periods in a row before a round is declared impossible


def weight(staleness: PolynomialStaleness | HingeStaleness | ConstantStaleness, tau: int) -> float:
    """``s(τ)``: the weight of an update ``tau`` server steps stale (``s(0) = 1``)."""
    if isinstance(staleness, ConstantStaleness):
        return 1.0
    if isinstance(staleness, PolynomialStaleness):
        return float((1.0 + tau) ** (-staleness.a))
    return 1.0 if tau <= staleness.b else 1.0 / (staleness.a * (tau - staleness.b) + 1.0)


@dataclass(frozen=True)
class Shape:
    """The run's asynchronous server: how many train at once, how many arrivals a step."""

    concurrency: int
    buffer_size: int

    @classmethod
    def of(cls, policy: PolicyConfig, clients_per_round: int, num_clients: int) -> Shape:
        k = 1 if policy.aggregation == "fedasync" else policy.buffer_size or clients_per_round
        c = policy.concurrency or clients_per_round
        for key, value in (("concurrency", c), ("buffer_size", k)):
            if value > num_clients:
                raise InputError(
                    f"train.system.policy.{key}={value} exceeds the run's {num_clients} clients"
                    + ("" if getattr(policy, key) else " (null: train.clients_per_round)")
                )
        return cls(c, k)


def refuse(algorithm: FedAlgorithm[Any], policy: PolicyConfig, nproc: int) -> None:
    """Raise :class:`InputError` if ``algorithm`` cannot run under ``policy``'s aggregation."""
    agg = policy.aggregation
    if agg == "sync":
        return
    if not algorithm.execution.delta_uplink:
        raise InputError(
            f"train.system.policy.aggregation={agg}: algorithm {algorithm.name!r} cannot run "
            "asynchronously: its server step is not a weighted average of client deltas from "
            "the global model they downloaded (its state must advance in synchronous rounds). "
            "Asynchronous aggregation runs fedavg and fedprox, with any uplink codec"
        )
    if nproc > 1:
        raise InputError(
            f"train.system.policy.aggregation={agg} runs in one process: set train.nproc=1 "
            f"(got {nproc})"
        )


@dataclass
class InFlight:
    """A client training: started, trained and encoded, its upload not yet arrived."""

    turn: Turn  # trained on version ``version``
    encoded: Encoded  # its uplink
    timed: Timed  # its time from its start (down, compute, up)
    version: int  # the global model it trained on (server steps before its start)
    start_s: float  # simulated seconds since the run began
    limit_s: float = math.inf  # from its start: deadline_s, or its departure if earlier
    leave_s: float = math.inf  # from its start: when it goes offline (check: interval)

    @property
    def client_id(self) -> int:
        return self.turn.client_id

    @property
    def arrival_s(self) -> float:
        return self.start_s + self.timed.time.finish_s

    @property
    def late(self) -> bool:
        """It will not arrive by its limit (dropped at ``start_s + limit_s``)."""
        return self.timed.time.finish_s > self.limit_s

    @property
    def event_s(self) -> float:
        """When it next matters: its arrival, or its limit if that comes first."""
        return self.start_s + self.limit_s if self.late else self.arrival_s

    @property
    def departed(self) -> bool:
        """Late because it went offline first (before its deadline)."""
        return self.late and self.leave_s <= self.limit_s


@dataclass
class Flight:
    """The asynchronous server's state between rounds (checkpointed with the run)."""

    clients: list[InFlight] = field(default_factory=list)
    # fedasync: the global model of each version a client in flight trained on
    versions: dict[int, ParamDict] = field(default_factory=dict)


@dataclass(frozen=True)
class Played:
    """Round ``r``'s outcome: who arrived (arrival order), who was dropped, the clock."""

    arrived: list[InFlight]
    dropped: list[tuple[InFlight, int]]  # with the uplink bits sent by its time limit
    started: int  # clients started this round
    online: int  # online at the round's start
    round_s: float
    staleness: dict[int, int]  # client id -> τ of the arrivals
    energy: energy.RoundEnergy | None = None  # the step's joules (system.energy only)


def play_round(
    sim: SystemRun,
    rnd: Round,
    flight: Flight,
    shape: Shape,
    start_s: float,
    global_params: Callable[[], ParamDict],
) -> Played:
    """Round ``rnd`` (one server step) of an asynchronous server: slots filled, time run until
    ``K`` arrivals, their uplinks charged and taken (module doc). ``global_params``: the
    current global model (kept per version under fedasync, to re-base its arrivals)."""
    policy = sim.cfg.policy
    seed, number = rnd.run.seed, rnd.number
    version = number - 1
    started: set[int] = set()
    draws = 0

    def fill(at_s: float) -> None:
        """Free slots filled at ``at_s`` from the idle online clients."""
        nonlocal draws
        free = shape.concurrency - len(flight.clients)
        if free <= 0:
            return
        online = sim.population.online(seed, number, at_s, draws)
        busy = started | {f.client_id for f in flight.clients}
        idle = [c for c in online if c not in busy and rnd.run.data.train[c].num_examples]
        chosen = selection.choose(policy, rnd.state.selection, seed, number, idle, free, draws)
        draws += 1
        if chosen and policy.aggregation == "fedasync" and version not in flight.versions:
            flight.versions[version] = {k: v.detach().clone() for k, v in global_params().items()}
        for turn in rnd.turns(chosen, algorithm=sim.trains_with):
            cid = turn.client_id
            down_bits = rnd.send_down(turn, version)
            t = fitted(sim, rnd, turn, down_bits, at_s)
            limit, leave = sim.limit_s(cid, at_s), sim.leave_s(cid, at_s)
            flight.clients.append(InFlight(t.turn, t.encoded, t, version, at_s, limit, leave))
            started.add(cid)

    online = len(sim.population.online(seed, number, start_s))  # the round's first draw
    fill(start_s)
    now, idle_runs = start_s, 0
    buffer: list[InFlight] = []
    dropped: list[tuple[InFlight, int]] = []
    while len(buffer) < shape.buffer_size:
        if not flight.clients:  # nobody training, nobody could start: the server waits
            idle_runs += 1
            if idle_runs > MAX_IDLE or started >= _with_data(rnd):
                raise InputError(
                    f"round {number}: {len(buffer)} of buffer_size={shape.buffer_size} uploads "
                    f"arrived and no client is left to start (each starts once a round; "
                    f"{len(dropped)} dropped past deadline_s={policy.deadline_s}): lower "
                    "buffer_size or raise deadline_s"
                )
            now += policy.idle_s
            fill(now)
            continue
        idle_runs = 0
        now = min(f.event_s for f in flight.clients)
        due = sorted((f for f in flight.clients if f.event_s == now), key=lambda f: f.client_id)
        for f in due:
            if f.late:
                dropped.append((f, sent_by(sim, f.timed, f.start_s, now - f.start_s)))
            elif len(buffer) < shape.buffer_size:
                buffer.append(f)
            else:
                continue  # arrives with the next round, at this same instant
            flight.clients.remove(f)
        if len(buffer) < shape.buffer_size:
            fill(now)
    staleness = {f.client_id: version - f.version for f in buffer}
    charged: list[tuple[energy.ClientEnergy, bool]] = []
    for f in buffer:
        joules = charge(sim, f.timed)
        rnd.send_up(f.client_id, f.encoded.payload, f.version)
        rnd.take(f.turn, f.encoded, _row(f, "aggregated", staleness[f.client_id], joules))
        charged += [(joules, False)] if joules is not None else []
    for f, sent in dropped:  # charged for what it did until its limit
        joules = charge(sim, f.timed, stop_s=f.limit_s)
        row = _row(f, "departed" if f.departed else "dropped", version - f.version, joules)
        rnd.cut(f.turn, f.encoded.payload, sent, row, f.version)
        charged += [(joules, True)] if joules is not None else []
    selection.observe(rnd.state.selection, reports([f.timed for f in buffer]), number)
    spent = None
    if sim.energy is not None:
        spent = energy.round_energy(charged, energy.spent_j(rnd.state.round_rows))
    return Played(buffer, dropped, len(started), online, now - start_s, staleness, spent)


def weigh(
    policy: PolicyConfig,
    played: Played,
    flight: Flight,
    current: ParamDict,
) -> Callable[[Sequence[Uplink]], list[Uplink]]:
    """The round's uplinks as the server step takes them: FedBuff's scaled by ``s(τ)``,
    FedAsync's re-based on the current model and scaled by ``α s(τ)`` (module doc)."""
    version_of = {f.client_id: f.version for f in played.arrived}

    def apply(uplinks: Sequence[Uplink]) -> list[Uplink]:
        out = []
        for u in uplinks:
            tau = played.staleness[u.client_id]
            s = weight(policy.staleness, tau)
            if policy.aggregation == "fedasync":
                start = flight.versions[version_of[u.client_id]]
                a = policy.mixing * s
                tensors = {k: a * (start[k] + d - current[k]) for k, d in u.tensors.items()}
            elif s == 1.0:
                tensors = dict(u.tensors)
            else:
                tensors = {k: s * d for k, d in u.tensors.items()}
            out.append(Uplink(u.client_id, u.num_examples, tensors))
        return out

    return apply


def forget(flight: Flight) -> None:
    """Drop the kept models no client in flight trained on (fedasync)."""
    held = {f.version for f in flight.clients}
    for v in [v for v in flight.versions if v not in held]:
        del flight.versions[v]


def round_metrics(
    played: Played, in_flight: int, start_s: float, sim: SystemRun
) -> dict[str, float | None]:
    """The round's ``time/sim_*`` and ``system/*`` metrics (``system/staleness_*``: the
    aggregated uploads' τ; ``system/departed`` and ``system/uplink_setting`` as a synchronous
    round's)."""
    taus = list(played.staleness.values())
    extra: dict[str, float | None] = {}
    if sim.cfg.policy.check == "interval":
        extra["system/departed"] = float(sum(f.departed for f, _ in played.dropped))
    if sim.ladder is not None:
        sent = [f.timed.setting for f in played.arrived if f.timed.setting is not None]
        extra["system/uplink_setting"] = sum(sent) / len(sent) if sent else None
    return {
        "time/sim_round_s": played.round_s,
        "time/sim_elapsed_s": start_s + played.round_s,
        "system/online": float(played.online),
        "system/sampled": float(played.started),
        "system/finished": float(len(played.arrived)),
        "system/dropped": float(len(played.dropped)),
        "system/partial": 0.0,
        "system/in_flight": float(in_flight),
        "system/staleness_mean": float(np.mean(taus)) if taus else None,
        "system/staleness_max": float(max(taus)) if taus else None,
        **extra,
        **(played.energy.metrics() if played.energy is not None else {}),
    }


def _row(f: InFlight, status: str, tau: int, joules: energy.ClientEnergy | None) -> dict[str, Any]:
    """A client's row: its simulated part (seconds from its own start; its joules under
    ``system.energy``), its version and τ."""
    return {
        **client_row(f.timed, status, energy=joules),
        "version": f.version,
        "staleness": tau,
        "sim_start_s": f.start_s,
    }


def _with_data(rnd: Round) -> set[int]:
    return {c for c, d in enumerate(rnd.run.data.train) if d.num_examples}
