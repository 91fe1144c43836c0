"""The round under a ``system`` section (simulated time): clients timed from their encoded bits and
their local work, the round settled by the deadline and over-selection.

Every sampled client is trained and encoded as always; here each client's messages and work
become simulated seconds (:mod:`fedcomm.system.clock`), and :func:`settle` decides who is
aggregated: the first ``K`` to finish within the deadline. A straggler is dropped, or under
``stragglers: partial`` trained again for the local steps that fit before the deadline and
aggregated if its new uplink then makes it. Dropped clients keep their state from before the
round: the server never saw their work.

:func:`play_round` is the loop's client steps under simulated time: it asks the round
(:class:`~fedcomm.simulation.rounds.Round`) to train, record and encode every client, settles
the round, then has the round take the accepted clients and cut the dropped ones' uplinks
(``not_sent`` / ``partial``, with a ``dropped`` client row).

Under ``system.energy`` each client's round is also charged in joules
(:mod:`fedcomm.system.energy`; :func:`charge`): its client row gets the energy columns, the
round its ``energy/*`` metrics (every sampled client, the dropped ones for what they did until the
round closed).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.simulation.backends import Turn
from fedcomm.simulation.data import FederatedTensors
from fedcomm.simulation.rounds import Encoded, Round
from fedcomm.system import energy
from fedcomm.system import population as pop
from fedcomm.system.clock import ClientTime, batch_sizes, client_time, decide, steps_that_fit
from fedcomm.system.config import SystemConfig
from fedcomm.system.flops import WeightCost, example_flops, forward_flops


@dataclass(frozen=True)
class SystemRun:
    """A run's simulated clients and the FLOPs of its model, fixed for the run."""

    cfg: SystemConfig
    population: pop.Population
    cost: WeightCost
    sparse: bool  # the algorithm's sparse_compute: weights charged by their nonzero fraction
    energy: energy.EnergyModel | None = None  # system.energy's (None: no energy computed)

    @classmethod
    def build(
        cls,
        cfg: SystemConfig,
        model: nn.Module,
        data: FederatedTensors,
        seed: int,
        root: Path | None,
        *,
        sparse: bool = False,
    ) -> SystemRun:
        source = next(d for d in data.train if d.num_examples)
        cost = forward_flops(model, source.x[:1])
        clients = pop.draw(cfg, data.num_clients, seed, root)
        joules = None if cfg.energy is None else energy.build(cfg, clients, seed, root)
        return cls(cfg, clients, cost, sparse, joules)

    def example_flops(self, turn: Turn) -> float:
        """Training FLOPs of one example of ``turn``'s client (system/flops.py)."""
        return example_flops(self.cost, turn.result.local_params, sparse=self.sparse)

    def sample_size(self, k: int) -> int:
        """``K(1 + f)``, rounded up, at most every client."""
        return min(self.population.size, math.ceil(k * (1 + self.cfg.policy.over_selection)))

    def cohort(self, seed: int, round_: int, at_s: float, k: int) -> tuple[list[int], int]:
        """The round's sampled clients among the online ones, and how many were online."""
        online = self.population.online(seed, round_, at_s)
        return pop.cohort(seed, round_, online, self.sample_size(k)), len(online)


@dataclass(frozen=True)
class Timed:
    """One client's trained and encoded round, with its simulated time."""

    turn: Turn
    encoded: Encoded  # its uplink as encoded
    down_bits: int
    time: ClientTime
    sizes: tuple[int, ...]  # the sizes of the local minibatches it ran
    work_flops: float | None = None  # FLOPs of those minibatches (None: compute_s x its FLOP/s)


def time_turn(
    sim: SystemRun,
    turn: Turn,
    encoded: Encoded,
    down_bits: int,
    local: LocalConfig,
    start_s: float,
    steps: int | None = None,
) -> Timed:
    """``turn``'s simulated time: its downlink, ``steps`` local minibatches (all of ``local``'s
    when None) at its speed, its ``encoded`` uplink."""
    cid = turn.client_id
    sizes = batch_sizes(turn.result.num_examples, local.batch_size, local.epochs, local.steps)
    if steps is not None:
        sizes = sizes[:steps]
    work = sum(sizes) * sim.example_flops(turn)
    p = sim.population
    t = client_time(
        cid, p.down[cid], p.up[cid], float(p.latency_s[cid]), float(p.flops_per_s[cid]),
        round_start_s=start_s, down_bits=down_bits, work_flops=work,
        up_bits=encoded.payload.nbits().total,
    )  # fmt: skip
    return Timed(turn, encoded, down_bits, t, tuple(sizes), work)


@dataclass(frozen=True)
class Settled:
    """The round's outcome: who is aggregated (cohort order) and the round's length."""

    accepted: list[Timed]
    partial: frozenset[int]  # accepted after partial work
    dropped: list[tuple[Timed, int]]  # with the uplink bits sent before the round closed
    round_s: float
    energy: energy.RoundEnergy | None = None  # its joules (system.energy only)


Retrain = Callable[[Timed, int], Timed]  # a straggler, the local steps that fit -> retimed


def settle(
    sim: SystemRun, timed: Sequence[Timed], k: int, start_s: float, retrain: Retrain
) -> Settled:
    """The first ``k`` to finish within the deadline; stragglers retrained under ``partial``."""
    policy = sim.cfg.policy
    deadline = policy.deadline_s
    if not timed:  # nobody online: the server waits
        return Settled([], frozenset(), [], deadline or policy.idle_s)
    decision = decide([t.time for t in timed], k, deadline)
    chosen = {t.turn.client_id: t for t in timed if t.turn.client_id in decision.accepted}
    partial: set[int] = set()
    if policy.stragglers == "partial" and deadline is not None and len(chosen) < k:
        late = sorted(
            (t for t in timed if t.time.finish_s > deadline), key=lambda t: t.turn.client_id
        )
        redone = [r for r in (_partial(sim, t, deadline, retrain) for t in late) if r]
        for r in sorted(redone, key=lambda r: (r.time.finish_s, r.turn.client_id)):
            if len(chosen) == k:
                break
            chosen[r.turn.client_id] = r
            partial.add(r.turn.client_id)
    round_s = decision.round_s if not partial else float(deadline or decision.round_s)
    accepted = [chosen[t.turn.client_id] for t in timed if t.turn.client_id in chosen]
    dropped = [
        (t, _sent_by(sim, t, start_s, round_s)) for t in timed if t.turn.client_id not in chosen
    ]
    return Settled(accepted, frozenset(partial), dropped, round_s)


def _partial(sim: SystemRun, t: Timed, deadline: float, retrain: Retrain) -> Timed | None:
    """``t`` retrained for the steps that fit before ``deadline`` (its full upload's time
    reserved), if any fit and the new upload makes it."""
    per_example = sim.example_flops(t.turn) / float(sim.population.flops_per_s[t.turn.client_id])
    budget = deadline - 2 * t.time.latency_s - t.time.down_s - t.time.up_s
    fits = min(len(t.sizes) - 1, steps_that_fit(t.sizes, per_example, budget))
    if fits < 1:
        return None
    redone = retrain(t, fits)
    return redone if redone.time.finish_s <= deadline else None


def _sent_by(sim: SystemRun, t: Timed, start_s: float, round_s: float) -> int:
    """Uplink bits a dropped client had sent when the round closed (``cut_uplink: partial``;
    0 under ``not_sent``)."""
    if sim.cfg.policy.cut_uplink == "not_sent":
        return 0
    up = sim.population.up[t.turn.client_id]
    sent = up.bits_between(start_s + t.time.up_start_s, start_s + round_s)
    return min(t.encoded.payload.nbits().total, int(sent))


def play_round(
    sim: SystemRun, rnd: Round, cohort: Sequence[int], k: int, start_s: float
) -> Settled:
    """Round ``rnd`` under simulated time: every client of ``cohort`` trained, its downlink
    recorded, its uplink encoded and timed from its bits and work; the round settled; then
    each accepted client's uplink recorded and the client taken (cohort order, its client row
    with its simulated part), each dropped one's uplink recorded as cut with a ``dropped`` row.
    """
    clocked: list[Timed] = []
    for turn in rnd.turns(cohort):
        down_bits = rnd.send_down(turn)
        clocked.append(time_turn(sim, turn, rnd.encode(turn), down_bits, rnd.run.local, start_s))
    settled = settle(sim, clocked, k, start_s, functools.partial(_retrain, sim, rnd, start_s))
    charged: list[tuple[energy.ClientEnergy, bool]] = []
    for t in settled.accepted:
        rnd.send_up(t.turn.client_id, t.encoded.payload)
        status = "partial_work" if t.turn.client_id in settled.partial else "aggregated"
        joules = charge(sim, t)
        rnd.take(t.turn, t.encoded, client_row(t, status, energy=joules))
        charged += [(joules, False)] if joules is not None else []
    for t, sent in settled.dropped:
        joules = charge(sim, t, stop_s=settled.round_s)
        rnd.cut(t.turn, t.encoded.payload, sent, client_row(t, "dropped", energy=joules))
        charged += [(joules, True)] if joules is not None else []
    if sim.energy is None:
        return settled
    spent = energy.round_energy(charged, energy.spent_j(rnd.state.round_rows))
    return dataclasses.replace(settled, energy=spent)


def charge(sim: SystemRun, t: Timed, stop_s: float | None = None) -> energy.ClientEnergy | None:
    """``t``'s joules (None without ``system.energy``): its encoded downlink and uplink bits and
    its local work, as timed; ``stop_s`` (seconds from its round's start): it stopped then
    (:func:`fedcomm.system.energy.client_energy`)."""
    if sim.energy is None:
        return None
    cid = t.turn.client_id
    work = t.work_flops
    if work is None:
        work = t.time.compute_s * float(sim.population.flops_per_s[cid])
    return energy.client_energy(
        sim.energy, t.time, down_bits=t.down_bits, work_flops=work,
        up_bits=t.encoded.payload.nbits().total, stop_s=stop_s,
    )  # fmt: skip


def _retrain(sim: SystemRun, rnd: Round, start_s: float, t: Timed, steps: int) -> Timed:
    """A straggler's partial work: its client trained again for the first ``steps`` local
    minibatches, encoded and timed (its downlink as before)."""
    local = rnd.run.local
    partial_local = LocalConfig(**{**local.model_dump(), "epochs": None, "steps": steps})
    turn = rnd.retrain(t.turn.client_id, partial_local)
    return time_turn(sim, turn, rnd.encode(turn), t.down_bits, local, start_s, steps)


def elapsed_s(round_rows: Sequence[Mapping[str, Any]]) -> float:
    """Simulated seconds the run has spent so far (0 without a ``system`` section)."""
    if not round_rows:
        return 0.0
    return float(round_rows[-1].get("time/sim_elapsed_s") or 0.0)


def client_row(
    t: Timed, status: str, *, energy: energy.ClientEnergy | None = None
) -> dict[str, Any]:
    """A client's simulated round in its client row (seconds from the round's start; with
    ``energy``, its joules: ``energy_down_j``, ``energy_compute_j``, ``energy_up_j``,
    ``energy_j``)."""
    c = t.time
    return {
        "status": status,
        "local_steps": len(t.sizes),
        "sim_down_s": c.down_s,
        "sim_compute_s": c.compute_s,
        "sim_up_s": c.up_s,
        "sim_finish_s": c.finish_s,
        **(energy.row() if energy is not None else {}),
    }


def round_metrics(
    settled: Settled, sampled: int, online: int, start_s: float
) -> dict[str, float | None]:
    """The round's ``time/sim_*`` and ``system/*`` metrics, and its ``energy/*`` ones under
    ``system.energy``."""
    finished = len(settled.accepted)
    return {
        "time/sim_round_s": settled.round_s,
        "time/sim_elapsed_s": start_s + settled.round_s,
        "system/online": float(online),
        "system/sampled": float(sampled),
        "system/finished": float(finished),
        "system/dropped": float(sampled - finished),
        "system/partial": float(len(settled.partial)),
        **(settled.energy.metrics() if settled.energy is not None else {}),
    }
