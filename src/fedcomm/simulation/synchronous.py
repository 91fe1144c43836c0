"""The synchronous round under a ``system`` section: the cohort timed, the round settled by the
deadline, over-selection and (``check: interval``) departures, then taken.

:func:`settle` decides who is aggregated: the first ``K`` to finish within the deadline and
before they leave. A straggler is dropped, or under ``stragglers: partial`` trained again for
the local steps that fit before its limit and aggregated if its new uplink then makes it. A
client that went offline before it finished is ``departed``. Dropped clients keep their state
from before the round: the server never saw their work.

:func:`play_round` is the loop's client steps under simulated time: it asks the round
(:class:`~fedcomm.simulation.rounds.Round`) to train, record and encode every client (at the
codec setting ``fit_deadline`` picks, :func:`~fedcomm.simulation.timed.fitted`), settles the
round, then has the round take the accepted clients and cut the dropped ones' uplinks
(``not_sent`` / ``partial``, with a ``dropped`` or ``departed`` client row), each charged its
joules under ``system.energy``, and Oort told what the aggregated clients reported.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fedcomm.simulation.rounds import Round
from fedcomm.simulation.timed import (
    SystemRun,
    Timed,
    charge,
    client_row,
    fitted,
    reports,
    steps_local,
)
from fedcomm.system import energy, selection
from fedcomm.system.clock import decide, steps_that_fit


@dataclass(frozen=True)
class Settled:
    """The round's outcome: who is aggregated (cohort order) and the round's length."""

    accepted: list[Timed]
    partial: frozenset[int]  # accepted after partial work
    dropped: list[tuple[Timed, int]]  # with the uplink bits sent before the round closed
    round_s: float
    energy: energy.RoundEnergy | None = None  # its joules (system.energy only)
    departed: frozenset[int] = frozenset()  # dropped because it went offline (check interval)


Retrain = Callable[[Timed, int], Timed]  # a straggler, the local steps that fit -> retimed


def settle(
    sim: SystemRun, timed: Sequence[Timed], k: int, start_s: float, retrain: Retrain
) -> Settled:
    """The first ``k`` to finish within the deadline; stragglers retrained under ``partial``."""
    policy = sim.cfg.policy
    deadline = policy.deadline_s
    if not timed:  # nobody online: the server waits
        return Settled([], frozenset(), [], deadline or policy.idle_s)
    leaves = {t.turn.client_id: sim.leave_s(t.turn.client_id, start_s) for t in timed}
    limit = {t.turn.client_id: sim.limit_s(t.turn.client_id, start_s) for t in timed}
    decision = decide([t.time for t in timed], k, deadline, leaves)
    chosen = {t.turn.client_id: t for t in timed if t.turn.client_id in decision.accepted}
    partial: set[int] = set()
    if policy.stragglers == "partial" and deadline is not None and len(chosen) < k:
        late = sorted(
            (t for t in timed if t.time.finish_s > limit[t.turn.client_id]),
            key=lambda t: t.turn.client_id,
        )
        redone = [
            r for r in (_partial(sim, t, limit[t.turn.client_id], retrain) for t in late) if r
        ]
        for r in sorted(redone, key=lambda r: (r.time.finish_s, r.turn.client_id)):
            if len(chosen) == k:
                break
            chosen[r.turn.client_id] = r
            partial.add(r.turn.client_id)
    round_s = decision.round_s if not partial else float(deadline or decision.round_s)
    accepted = [chosen[t.turn.client_id] for t in timed if t.turn.client_id in chosen]
    out = [t for t in timed if t.turn.client_id not in chosen]
    dropped = [(t, sent_by(sim, t, start_s, min(round_s, leaves[t.turn.client_id]))) for t in out]
    departed = frozenset(
        t.turn.client_id
        for t in out
        if leaves[t.turn.client_id] < min(t.time.finish_s, deadline or math.inf)
    )
    return Settled(accepted, frozenset(partial), dropped, round_s, departed=departed)


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


def sent_by(sim: SystemRun, t: Timed, start_s: float, round_s: float) -> int:
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
    for turn in rnd.turns(cohort, algorithm=sim.trains_with):
        down_bits = rnd.send_down(turn)
        clocked.append(fitted(sim, rnd, turn, down_bits, start_s))
    settled = settle(sim, clocked, k, start_s, functools.partial(_retrain, sim, rnd, start_s))
    charged: list[tuple[energy.ClientEnergy, bool]] = []
    for t in settled.accepted:
        rnd.send_up(t.turn.client_id, t.encoded.payload)
        status = "partial_work" if t.turn.client_id in settled.partial else "aggregated"
        joules = charge(sim, t)
        rnd.take(t.turn, t.encoded, client_row(t, status, energy=joules))
        charged += [(joules, False)] if joules is not None else []
    for t, sent in settled.dropped:
        cid = t.turn.client_id
        stop = min(settled.round_s, sim.leave_s(cid, start_s))
        joules = charge(sim, t, stop_s=stop)
        status = "departed" if cid in settled.departed else "dropped"
        rnd.cut(t.turn, t.encoded.payload, sent, client_row(t, status, energy=joules))
        charged += [(joules, True)] if joules is not None else []
    selection.observe(rnd.state.selection, reports(settled.accepted), rnd.number)
    if sim.energy is None:
        return settled
    spent = energy.round_energy(charged, energy.spent_j(rnd.state.round_rows))
    return dataclasses.replace(settled, energy=spent)


def _retrain(sim: SystemRun, rnd: Round, start_s: float, t: Timed, steps: int) -> Timed:
    """A straggler's partial work: its client trained again for the first ``steps`` local
    minibatches, encoded and timed (its downlink as before)."""
    turn = rnd.retrain(t.turn.client_id, steps_local(rnd.run.local, steps), sim.trains_with)
    return fitted(sim, rnd, turn, t.down_bits, start_s, steps)


def round_metrics(
    settled: Settled, sampled: int, online: int, start_s: float, sim: SystemRun | None = None
) -> dict[str, float | None]:
    """The round's ``time/sim_*`` and ``system/*`` metrics, and its ``energy/*`` ones under
    ``system.energy``; with ``sim``: ``system/departed`` under ``check: interval``, the mean
    codec setting sent under ``fit_deadline`` (``system/uplink_setting``)."""
    finished = len(settled.accepted)
    extra: dict[str, float | None] = {}
    if sim is not None and sim.cfg.policy.check == "interval":
        extra["system/departed"] = float(len(settled.departed))
    if sim is not None and sim.ladder is not None:
        sent = [t.setting for t in settled.accepted if t.setting is not None]
        extra["system/uplink_setting"] = sum(sent) / len(sent) if sent else None
    return {
        "time/sim_round_s": settled.round_s,
        "time/sim_elapsed_s": start_s + settled.round_s,
        "system/online": float(online),
        "system/sampled": float(sampled),
        "system/finished": float(finished),
        "system/dropped": float(sampled - finished),
        "system/partial": float(len(settled.partial)),
        **extra,
        **(settled.energy.metrics() if settled.energy is not None else {}),
    }
