"""Clients under a ``system`` section (simulated time): each one's round timed from its encoded
bits and its local work, on its own links and phone.

:class:`SystemRun` holds the run's drawn clients and its model's FLOPs; :func:`time_turn` turns a
trained, encoded client into seconds (:mod:`fedcomm.system.clock`); :func:`fitted` encodes and
times it at the codec setting ``compression: fit_deadline`` picks; :func:`charge` its joules
under ``system.energy`` (:mod:`fedcomm.system.energy`); :func:`client_row` its simulated part of
the client row. The synchronous round built on them is :mod:`.synchronous`, the asynchronous
server :mod:`.asynchronous`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.compressors.config import CompressorConfig, NoCompressor
from fedcomm.simulation import fitting
from fedcomm.simulation.backends import Turn
from fedcomm.simulation.data import FederatedTensors
from fedcomm.simulation.rounds import Encoded, Round
from fedcomm.system import energy, selection
from fedcomm.system import population as pop
from fedcomm.system.clock import ClientTime, batch_sizes, client_time
from fedcomm.system.config import SystemConfig
from fedcomm.system.flops import WeightCost, example_flops, forward_flops
from fedcomm.system.oort import Arms


@dataclass(frozen=True)
class SystemRun:
    """A run's simulated clients and the FLOPs of its model, fixed for the run."""

    cfg: SystemConfig
    population: pop.Population
    cost: WeightCost
    sparse: bool  # the algorithm's sparse_compute: weights charged by their nonzero fraction
    energy: energy.EnergyModel | None = None  # system.energy's (None: no energy computed)
    ladder: fitting.Ladder | None = None  # compression fit_deadline's settings (None: fixed)

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
        codec: CompressorConfig | None = None,
        algorithm: AlgorithmConfig | None = None,
    ) -> SystemRun:
        """``codec``: the run's uplink codec, whose setting ``fit_deadline`` varies, or
        ``algorithm``'s own (FedBIAD's ``p``)."""
        source = next(d for d in data.train if d.num_examples)
        cost = forward_flops(model, source.x[:1])
        clients = pop.draw(cfg, data.num_clients, seed, root)
        joules = None if cfg.energy is None else energy.build(cfg, clients, seed, root)
        fit = cfg.policy.compression
        ladder = None
        if fit.kind == "fit_deadline":
            ladder = fitting.ladder(codec or NoCompressor(), fit.ladder, algorithm, fit.vary)
        return cls(cfg, clients, cost, sparse, joules, ladder)

    @property
    def trains_with(self) -> FedAlgorithm[Any] | None:
        """The algorithm clients train under (None: the run's; ``fit_deadline`` over the
        algorithm's setting: its mildest)."""
        return self.ladder.first if self.ladder is not None else None

    def example_flops(self, turn: Turn) -> float:
        """Training FLOPs of one example of ``turn``'s client (system/flops.py)."""
        trained = turn.nonzero if turn.nonzero is not None else turn.result.local_params
        return example_flops(self.cost, trained, sparse=self.sparse)

    def sample_size(self, k: int) -> int:
        """``K(1 + f)``, rounded up, at most every client."""
        return min(self.population.size, math.ceil(k * (1 + self.cfg.policy.over_selection)))

    def cohort(
        self, seed: int, round_: int, at_s: float, k: int, arms: Arms | None = None
    ) -> tuple[list[int], int]:
        """The round's sampled clients among the online ones (``policy.selection``; ``arms``:
        Oort's), and how many were online."""
        online = self.population.online(seed, round_, at_s)
        chosen = selection.choose(self.cfg.policy, arms, seed, round_, online, self.sample_size(k))
        return chosen, len(online)

    def leave_s(self, client: int, at_s: float) -> float:
        """Seconds from ``at_s`` until ``client`` goes offline (``inf`` unless ``policy.check``
        is ``interval``)."""
        if self.cfg.policy.check == "start":
            return math.inf
        return self.population.offline_at(client, at_s) - at_s

    def limit_s(self, client: int, at_s: float) -> float:
        """Seconds from ``at_s`` by which ``client``'s upload must arrive: the deadline, or its
        departure if earlier (``inf``: neither)."""
        deadline = self.cfg.policy.deadline_s
        return min(math.inf if deadline is None else deadline, self.leave_s(client, at_s))


@dataclass(frozen=True)
class Timed:
    """One client's trained and encoded round, with its simulated time."""

    turn: Turn
    encoded: Encoded  # its uplink as encoded
    down_bits: int
    time: ClientTime
    sizes: tuple[int, ...]  # the sizes of the local minibatches it ran
    work_flops: float | None = None  # FLOPs of those minibatches (None: compute_s x its FLOP/s)
    setting: float | None = None  # fit_deadline: the setting (codec's or p) it was sent at


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


def fitted(
    sim: SystemRun,
    rnd: Round,
    turn: Turn,
    down_bits: int,
    start_s: float,
    steps: int | None = None,
) -> Timed:
    """``turn`` encoded and timed: through the run's codec, or under ``fit_deadline`` at the
    mildest setting whose upload arrives by its limit (:mod:`fedcomm.simulation.fitting`; a
    setting of the algorithm's: the client retrained under it, for ``steps`` minibatches when
    given)."""
    local = rnd.run.local
    if sim.ladder is None:
        return time_turn(sim, turn, rnd.encode(turn), down_bits, local, start_s, steps)

    def finish_s(t: Turn, enc: Encoded) -> float:
        return time_turn(sim, t, enc, down_bits, local, start_s, steps).time.finish_s

    def retrain(algorithm: FedAlgorithm[Any]) -> Turn:
        return rnd.retrain(turn.client_id, steps_local(local, steps), algorithm)

    limit = sim.limit_s(turn.client_id, start_s)
    trial = fitting.trials(rnd, turn, sim.ladder, retrain)
    sent, enc, value = fitting.fit(sim.ladder, trial, finish_s, limit)
    t = time_turn(sim, sent, enc, down_bits, local, start_s, steps)
    return dataclasses.replace(t, setting=value)


def steps_local(local: LocalConfig, steps: int | None) -> LocalConfig:
    """``local`` cut to its first ``steps`` minibatches (None: ``local``)."""
    if steps is None:
        return local
    return LocalConfig(**{**local.model_dump(), "epochs": None, "steps": steps})


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


def reports(taken: Sequence[Timed]) -> list[tuple[int, int, float | None, float]]:
    """What aggregated clients tell Oort: ``(client, examples, mean training loss, seconds
    from its start to its finish)``."""
    return [
        (t.turn.client_id, t.turn.result.num_examples,
         t.turn.result.metrics.get("train/loss"), t.time.finish_s)
        for t in taken
    ]  # fmt: skip


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
        **({"uplink_setting": t.setting} if t.setting is not None else {}),
        **(energy.row() if energy is not None else {}),
    }
