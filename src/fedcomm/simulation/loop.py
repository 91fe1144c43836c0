"""THE round loop. Every algorithm, every backend, every stage runs through :func:`run`.

Per round ``r`` (1-based):

1. sample the cohort without replacement from ``(seed, SAMPLING, r)``, in sorted client order;
2. downlink: ``algorithm.broadcast`` -> payload; the ledger records its bits; the client decodes;
3. each client: ``algorithm.client_update`` on its pre-tensorised data with the generator
   ``(seed, CLIENT, r, client)``; the uplink compressor encodes; the ledger records its bits;
   the server decodes; the client's returned model is evaluated on its own test split
   (its "last upload" for local accuracy) when local evaluation is due this round, else kept
   until it is; its state goes to the client store;
4. ``algorithm.server_update`` on the decoded uplinks (first mapped by the compressor's
   ``server_hook``, if any: SignSGD's majority vote);
5. local accuracy when due (``local_eval_every``): the uploads kept since the last one are
   evaluated, every other client's last result is reused; the global model when due
   (``eval_every``), each distinct test example once (:mod:`fedcomm.simulation.global_eval`);
   log one batch of metrics; checkpoint when due.

Steps 2-3 are a :class:`~fedcomm.simulation.rounds.Round`'s: the loop (or, under a ``system``
section, :func:`fedcomm.simulation.synchronous.play_round`) asks it to train, record, encode and
take each client; steps 4-5 read what it gathered. Step 3 runs on the configured backend
(:mod:`fedcomm.simulation.backends`): ``sequential`` reuses one model object for every client
(parameters passed explicitly, never deep-copied into per-client modules); ``vectorized`` trains
the cohort as one batched computation. Both hand back the clients in cohort order, so the rest
of the round is the same code. Under ``train.system.policy.aggregation: fedbuff | fedasync`` a
round is one asynchronous server step instead (:mod:`fedcomm.simulation.asynchronous`: clients
in flight across rounds, their deltas weighed by staleness). Beside this file: ``start.py``
(round 0 of a fresh run), ``rounds.py`` (the round), ``timed.py`` (the clients timed under a
``system`` section), ``synchronous.py`` (the timed round settled), ``asynchronous.py``,
``fitting.py`` (``fit_deadline``), ``local_eval.py`` (the client store, local accuracy),
``divergence.py``, ``round_metrics.py`` (comm, loss and density), ``global_eval.py``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from fedcomm.algorithms.core import FedAlgorithm, RoundContext, Uplink, split_members
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import Compressor
from fedcomm.comm.compressors.config import CompressorConfig
from fedcomm.comm.ledger import Ledger
from fedcomm.errors import Interrupted, interrupts_deferred, stopping
from fedcomm.models.progressive import dense_numel
from fedcomm.seeding import Stream, numpy_rng, torch_generator
from fedcomm.simulation import (
    asynchronous,
    checkpoint,
    device,
    local_eval,
    shard,
    synchronous,
    timed,
)
from fedcomm.simulation.backends import Backend
from fedcomm.simulation.data import FederatedTensors
from fedcomm.simulation.divergence import DivergenceError
from fedcomm.simulation.global_eval import evaluate_global
from fedcomm.simulation.round_metrics import (
    aggregate_client_metrics,
    comm_metrics,
    density,
    weighted,
)
from fedcomm.simulation.rounds import Round, RunParts
from fedcomm.simulation.start import initial_state
from fedcomm.system import selection
from fedcomm.system.config import SystemConfig
from fedcomm.types import ParamDict

CRASH_ENV = "FEDCOMM_KILL_AFTER_ROUND"  # test hook: SIGKILL this process after that round
CRASH_RANK_ENV = "FEDCOMM_KILL_RANK"  # with it: only torchrun's process of that rank


class Tracker(Protocol):
    @property
    def run_id(self) -> str | None: ...

    def log_round(self, round_: int, metrics: Mapping[str, float | None]) -> None: ...


@dataclass(frozen=True)
class LoopConfig:
    """The knobs of the loop itself (a view of ``train`` plus the seed)."""

    rounds: int
    clients_per_round: int
    local: LocalConfig
    seed: int
    eval_every: int = 1
    local_eval_every: int = 1  # local accuracy every n rounds (and the last); 1: at each upload
    eval_batch_size: int = 2048
    topk: int = 1
    checkpoint_every: int = 5
    backend: str = "sequential"  # "sequential" | "vectorized" (see simulation.backends)
    chunk_size: int | str = 128  # vectorized: clients trained as one batch at most, or "auto"
    compile: str = "none"  # vectorized: torch.compile of the batched step (vectorized.Compiler)
    device: str = "auto"  # train.device (see simulation.device)
    precision: str = "fp32"  # train.precision: local training's autocast
    on_divergence: str = "stop"  # "stop" | "skip" a diverged client (see DivergenceError)
    divergence_loss: float = 1e6
    system: SystemConfig | None = None  # simulated time; None: none, as without a system section
    codec: CompressorConfig | None = None  # the uplink codec's config (system fit_deadline's)
    data_root: Path | None = None  # where system's real traces are read


@dataclass(frozen=True)
class RunResult:
    state: checkpoint.RunState
    final_params: ParamDict
    ledger: Ledger
    resumed_from: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    backend: str = "sequential"  # the backend that actually ran the clients
    checkpoint_round: int | None = None  # the round of the checkpoint on disk (None: none kept)


@dataclass
class _Mark:
    """Where :func:`_run` is, for :class:`~fedcomm.errors.Interrupted`: the round being trained
    (0: the run's state is not known yet) and the round of the checkpoint on disk (None: none)."""

    at: int = 0
    kept: int | None = None


def sample_cohort(seed: int, round_: int, num_clients: int, k: int) -> list[int]:
    """``k`` distinct clients for round ``round_``, sorted."""
    if k > num_clients:
        raise ValueError(f"train.clients_per_round={k} exceeds the {num_clients} clients")
    rng = numpy_rng(seed, Stream.SAMPLING, round_)
    return sorted(int(c) for c in rng.choice(num_clients, size=k, replace=False))


def run(
    cfg: LoopConfig,
    algorithm: FedAlgorithm[Any],
    model: nn.Module,
    data: FederatedTensors,
    compressor: Compressor,
    *,
    config_hash: str,
    checkpoint_path: Path | None = None,
    tracker: Tracker | None = None,
    resume: bool = True,
    progress: Callable[[int, Mapping[str, float | None]], None] | None = None,
    sharded: shard.Shard | None = None,
) -> RunResult:
    """Train ``algorithm`` for ``cfg.rounds`` rounds; resume from ``checkpoint_path`` if valid.

    ``sharded``: this process is one rank of a ``torchrun`` job (:mod:`.shard`): it trains its
    share of each cohort and gets the others' clients; only rank 0 evaluates and saves
    checkpoints (every rank reads the one on disk first), and on CUDA each rank takes its own GPU.

    ``model`` provides the structure and the initial parameters (already seeded by the caller);
    an algorithm with ``prepare_model`` (ProgFed) wraps it first. The model and ``data`` move to
    ``cfg.device`` once, here; everything the round does happens there. The returned tensors
    (final parameters, the state) are on that device.

    Ctrl-C (:class:`KeyboardInterrupt`) once the run's state is known (round 0 on) raises
    :class:`~fedcomm.errors.Interrupted`, naming the round being trained and the round of the
    checkpoint on disk; a checkpoint being saved is finished first.
    """
    dev = device.resolve(cfg.device)
    if sharded is not None:
        dev = sharded.device(dev)
    mark = _Mark()
    with device.run_on(dev):
        try:
            return _run(
                cfg, algorithm, model.to(dev), data.to(dev), compressor, dev, mark,
                config_hash=config_hash, checkpoint_path=checkpoint_path, tracker=tracker,
                resume=resume, progress=progress, sharded=sharded,
            )  # fmt: skip
        except KeyboardInterrupt:
            stopping()
            if not mark.at:  # the checkpoint not read yet: the caller knows as much
                raise
            raise Interrupted(mark.at, mark.kept) from None


def _run(
    cfg: LoopConfig,
    algorithm: FedAlgorithm[Any],
    model: nn.Module,
    data: FederatedTensors,
    compressor: Compressor,
    dev: torch.device,
    mark: _Mark,
    *,
    config_hash: str,
    checkpoint_path: Path | None,
    tracker: Tracker | None,
    resume: bool,
    progress: Callable[[int, Mapping[str, float | None]], None] | None,
    sharded: shard.Shard | None = None,
) -> RunResult:
    if algorithm.prepare_model is not None:
        model = algorithm.prepare_model(model, cfg.seed).to(dev)
    shape = _asynchronous(cfg, algorithm, data, sharded)
    sim = (  # (its inputs checked before anything trains)
        None
        if cfg.system is None
        else timed.SystemRun.build(
            cfg.system, model, data, cfg.seed, cfg.data_root,
            sparse=algorithm.execution.sparse_compute, codec=cfg.codec, algorithm=algorithm.config,
        )
    )  # fmt: skip
    state = _start(cfg, algorithm, model, data, dev, mark, config_hash, checkpoint_path, resume)
    shard.barrier(sharded)  # every rank has read the checkpoint before rank 0 writes one
    writes = sharded is None or sharded.writes
    if not writes:  # (rank 0 logs, shows and saves)
        checkpoint_path, tracker, progress = None, None, None
    resumed_from = mark.at - 1
    if tracker is not None and state.run_id is None:
        state.run_id = tracker.run_id
    if checkpoint_path is not None and resumed_from == 0:  # a kill before round 1 keeps the run id
        _save(state, checkpoint_path, mark)
    ledger = Ledger(list(state.ledger_rows))
    backend = Backend(
        cfg.backend, algorithm, model, data, cfg.local, cfg.chunk_size, precision=cfg.precision,
        sharded=sharded, compile=cfg.compile,
    )  # fmt: skip
    parts = RunParts(
        algorithm, model, data, compressor, backend, cfg.local, cfg.seed, cfg.eval_batch_size,
        cfg.on_divergence, cfg.divergence_loss, dense_numel(model), evaluates=writes,
    )  # fmt: skip
    if shape is not None and state.flight is None:  # (a resumed run keeps its own)
        state.flight = asynchronous.Flight()
    if sim is not None and state.selection is None:  # Oort's arms (None: uniform)
        sizes = [d.num_examples for d in data.train]
        state.selection = selection.start(
            sim.cfg.policy, sim.population, sim.cost, sizes, cfg.local
        )
    for round_ in range(state.round_ + 1, cfg.rounds + 1):
        mark.at = round_
        t_round = time.perf_counter()
        metrics = _play_round(cfg, parts, sim, state, ledger, round_, shape)
        metrics["time/round_s"] = time.perf_counter() - t_round
        _close_round(cfg, state, ledger, round_, metrics, checkpoint_path, mark, tracker, progress)
    final = {k: v.detach().clone() for k, v in algorithm.global_params(state.server).items()}
    return RunResult(
        state, final, ledger, resumed_from, backend=backend.effective, checkpoint_round=mark.kept
    )


def _asynchronous(
    cfg: LoopConfig,
    algorithm: FedAlgorithm[Any],
    data: FederatedTensors,
    sharded: shard.Shard | None,
) -> asynchronous.Shape | None:
    """The asynchronous server's shape (None: synchronous rounds), the algorithm and the run
    checked for it before anything trains."""
    if cfg.system is None or cfg.system.policy.aggregation == "sync":
        return None
    policy = cfg.system.policy
    asynchronous.refuse(algorithm, policy, sharded.world if sharded is not None else 1)
    return asynchronous.Shape.of(policy, cfg.clients_per_round, data.num_clients)


def _start(
    cfg: LoopConfig,
    algorithm: FedAlgorithm[Any],
    model: nn.Module,
    data: FederatedTensors,
    dev: torch.device,
    mark: _Mark,
    config_hash: str,
    checkpoint_path: Path | None,
    resume: bool,
) -> checkpoint.RunState:
    """The checkpoint's state (``resume`` and a valid one), else round 0's; ``mark`` set."""
    state = (
        checkpoint.load(checkpoint_path, config_hash, map_location=dev)
        if (resume and checkpoint_path)
        else None
    )
    resumed_from = state.round_ if state is not None else 0
    mark.at, mark.kept = resumed_from + 1, None if checkpoint_path is None else resumed_from
    if state is None:  # round 0: the server's initial state, an algorithm's warm start
        state = initial_state(algorithm, model, data, cfg.seed, cfg.local, config_hash)
    return state


def _close_round(
    cfg: LoopConfig,
    state: checkpoint.RunState,
    ledger: Ledger,
    round_: int,
    metrics: dict[str, float | None],
    checkpoint_path: Path | None,
    mark: _Mark,
    tracker: Tracker | None,
    progress: Callable[[int, Mapping[str, float | None]], None] | None,
) -> None:
    """Round ``round_`` done: its row kept, logged, shown; a checkpoint when due."""
    state.round_ = round_
    state.round_rows.append({"round": round_, **metrics})
    state.ledger_rows = ledger.rows
    if tracker is not None:
        tracker.log_round(round_, metrics)
    if progress is not None:
        progress(round_, metrics)
    if checkpoint_path is not None and round_ % cfg.checkpoint_every == 0 and round_ < cfg.rounds:
        _save(state, checkpoint_path, mark)
    rank = os.environ.get("RANK", "0")
    if os.environ.get(CRASH_ENV) == str(round_) and os.environ.get(CRASH_RANK_ENV, rank) == rank:
        os.kill(os.getpid(), signal.SIGKILL)


def _save(state: checkpoint.RunState, path: Path, mark: _Mark) -> None:
    """Checkpoint ``state`` (its round); a Ctrl-C meanwhile waits until it is saved and marked."""
    with interrupts_deferred():
        checkpoint.save(state, path)
        mark.kept = state.round_


def _play_round(
    cfg: LoopConfig,
    parts: RunParts,
    sim: timed.SystemRun | None,
    state: checkpoint.RunState,
    ledger: Ledger,
    round_: int,
    shape: asynchronous.Shape | None = None,
) -> dict[str, float | None]:
    """Round ``round_`` (steps 1-5): the cohort's work taken, the server step, the metrics
    (``shape``: an asynchronous server's round instead, one server step)."""
    ctx = RoundContext(
        round_, torch_generator(cfg.seed, Stream.SERVER, round_), cfg.seed, parts.model
    )
    local_due = round_ % cfg.local_eval_every == 0 or round_ == cfg.rounds
    rnd = Round(parts, round_, state, ledger, ctx, local_due)
    start_s = timed.elapsed_s(state.round_rows)  # simulated seconds before this round (system only)
    settled: synchronous.Settled | None = None
    played: asynchronous.Played | None = None
    weigh = None
    if sim is not None and shape is not None:  # one asynchronous server step
        current = parts.algorithm.global_params(state.server)
        played = asynchronous.play_round(sim, rnd, state.flight, shape, start_s, lambda: current)
        weigh = asynchronous.weigh(sim.cfg.policy, played, state.flight, current)
        cohort, online = [f.client_id for f in played.arrived], played.online
    elif sim is None:  # 1.-3.
        cohort, online = (
            sample_cohort(cfg.seed, round_, parts.data.num_clients, cfg.clients_per_round),
            0,
        )
        for turn in rnd.turns(cohort):
            rnd.send_down(turn)
            enc = rnd.encode(turn)
            rnd.send_up(turn.client_id, enc.payload)
            rnd.take(turn, enc, {})
    else:  # K(1 + f) among the clients online now, timed from their bits and work, then settled
        cohort, online = sim.cohort(
            cfg.seed, round_, start_s, cfg.clients_per_round, state.selection
        )
        settled = synchronous.play_round(sim, rnd, cohort, cfg.clients_per_round, start_s)
    if not rnd.uplinks and (sim is None or rnd.skipped):
        raise DivergenceError(
            f"round {round_}: every client diverged ({len(rnd.skipped)} skipped). "
            "Lower train.local.lr"
        )
    server_s = _server_step(parts, state, rnd, weigh)  # 4.
    if played is not None:
        asynchronous.forget(state.flight)
    metrics: dict[str, float | None] = {
        **comm_metrics(
            rnd.up_bits, rnd.down_bits, rnd.up_dense_bits, ledger.bits(), ledger.up_bits(),
            parts.numel, ledger.downlinks(),
        ),
        "train/loss": weighted([lo for lo, _ in rnd.losses], [n for _, n in rnd.losses]),
        "time/client_s": float(np.mean(rnd.train_s)) if rnd.train_s else None,
        "time/client_max_s": float(np.max(rnd.train_s)) if rnd.train_s else None,
        "time/server_s": server_s,
    }  # fmt: skip
    if settled is not None:
        metrics.update(synchronous.round_metrics(settled, len(cohort), online, start_s, sim))
    if played is not None and sim is not None:
        metrics.update(asynchronous.round_metrics(played, len(state.flight.clients), start_s, sim))
    if rnd.skipped:
        metrics["train/diverged_clients"] = float(len(rnd.skipped))
    if local_due and parts.evaluates:  # 5. local accuracy
        local_eval.evaluate_pending(state, parts.model, parts.data, cfg.eval_batch_size)
        metrics.update(local_eval.local_metrics(state.clients, parts.data.num_clients))
    metrics.update(aggregate_client_metrics(rnd.client_metrics))
    metrics.update(_model_metrics(cfg, parts, state, round_))
    return metrics


def _server_step(
    parts: RunParts,
    state: checkpoint.RunState,
    rnd: Round,
    weigh: Callable[[list[Uplink]], list[Uplink]] | None = None,
) -> float:
    """The server's update from the round's uplinks (first mapped by the compressor's
    ``server_hook``: SignSGD's majority vote; then by ``weigh``: an asynchronous server's
    staleness); its wall seconds. A system round where no client made it leaves the server as
    it was."""
    t_server = time.perf_counter()
    uplinks = rnd.uplinks
    hook = parts.compressor.server_hook
    if hook is not None and uplinks:
        uplinks = [
            Uplink(u.client_id, u.num_examples, t)
            for u, t in zip(uplinks, hook(rnd.payloads), strict=True)
        ]
    if weigh is not None:
        uplinks = weigh(uplinks)
    if uplinks:
        state.server = parts.algorithm.server_update(state.server, uplinks, rnd.ctx)
    return time.perf_counter() - t_server


def _model_metrics(
    cfg: LoopConfig, parts: RunParts, state: checkpoint.RunState, round_: int
) -> dict[str, float | None]:
    """The algorithm's server metrics, the global model's density, and (when due, step 5) its
    accuracy: each distinct test example once; an ensemble's members each too."""
    algorithm = parts.algorithm
    metrics: dict[str, float | None] = {
        f"{algorithm.name}/{k}" if "/" not in k else k: v
        for k, v in algorithm.server_metrics(state.server).items()
    }
    params = algorithm.global_params(state.server)
    dens = density(params)
    metrics["model/density"] = dens
    metrics["model/sparsity"] = 1.0 - dens
    if parts.evaluates and (round_ % cfg.eval_every == 0 or round_ == cfg.rounds):
        members = split_members(params)
        batch = cfg.eval_batch_size
        g = evaluate_global(parts.model, members, parts.data, batch_size=batch, topk=(cfg.topk,))
        metrics["global/accuracy"] = g.union.accuracy
        metrics["global/loss"] = g.union.loss
        metrics["topk/accuracy"] = g.union.topk.get(cfg.topk)
        if len(members) > 1:  # an ensemble: each member's accuracy too
            for k, member in enumerate(members):
                one = evaluate_global(parts.model, member, parts.data, batch_size=batch).union
                metrics[f"global/member{k}/accuracy"] = one.accuracy
    return metrics
