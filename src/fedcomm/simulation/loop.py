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

Step 3 runs on the configured backend (:mod:`fedcomm.simulation.backends`): ``sequential``
reuses one model object for every client (parameters passed explicitly, never deep-copied into
per-client modules); ``vectorized`` trains the cohort as one batched computation. Both hand back
the clients in cohort order, so the rest of the round is the same code. Beside this file:
``start.py`` (round 0 of a fresh run), ``timed.py`` (step 3 under a ``system`` section: the
clients timed and the round settled), ``local_eval.py`` (the client store, local accuracy),
``divergence.py``, ``round_metrics.py`` (comm, loss and density), ``global_eval.py``.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from fedcomm.algorithms.core import FedAlgorithm, RoundContext, Uplink, split_members
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm import bits
from fedcomm.comm.codecs import Compressor
from fedcomm.comm.ledger import Ledger
from fedcomm.comm.payload import Payload
from fedcomm.errors import Interrupted, interrupts_deferred, stopping
from fedcomm.models.progressive import dense_numel
from fedcomm.seeding import Stream, numpy_rng, torch_generator
from fedcomm.simulation import checkpoint, device, local_eval, timed
from fedcomm.simulation.backends import Backend, RoundInputs, Turn
from fedcomm.simulation.data import FederatedTensors
from fedcomm.simulation.divergence import DivergenceError, diverged
from fedcomm.simulation.global_eval import evaluate_global
from fedcomm.simulation.local_eval import ClientRecord
from fedcomm.simulation.round_metrics import (
    aggregate_client_metrics,
    comm_metrics,
    density,
    weighted,
)
from fedcomm.simulation.start import initial_state
from fedcomm.system.config import SystemConfig
from fedcomm.types import ParamDict

CRASH_ENV = "FEDCOMM_KILL_AFTER_ROUND"  # test hook: SIGKILL this process after that round


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
    device: str = "auto"  # train.device (see simulation.device)
    precision: str = "fp32"  # train.precision: local training's autocast
    on_divergence: str = "stop"  # "stop" | "skip" a diverged client (see DivergenceError)
    divergence_loss: float = 1e6
    system: SystemConfig | None = None  # simulated time (issue 30); None: none, as before
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
    algorithm: FedAlgorithm,
    model: nn.Module,
    data: FederatedTensors,
    compressor: Compressor,
    *,
    config_hash: str,
    checkpoint_path: Path | None = None,
    tracker: Tracker | None = None,
    resume: bool = True,
    progress: Callable[[int, Mapping[str, float | None]], None] | None = None,
) -> RunResult:
    """Train ``algorithm`` for ``cfg.rounds`` rounds; resume from ``checkpoint_path`` if valid.

    ``model`` provides the structure and the initial parameters (already seeded by the caller);
    an algorithm with ``prepare_model`` (ProgFed) wraps it first. The model and ``data`` move to
    ``cfg.device`` once, here; everything the round does happens there. The returned tensors
    (final parameters, the state) are on that device.

    Ctrl-C (:class:`KeyboardInterrupt`) once the run's state is known (round 0 on) raises
    :class:`~fedcomm.errors.Interrupted`, naming the round being trained and the round of the
    checkpoint on disk; a checkpoint being saved is finished first.
    """
    dev = device.resolve(cfg.device)
    mark = _Mark()
    with device.run_on(dev):
        try:
            return _run(
                cfg, algorithm, model.to(dev), data.to(dev), compressor, dev, mark,
                config_hash=config_hash, checkpoint_path=checkpoint_path, tracker=tracker,
                resume=resume, progress=progress,
            )  # fmt: skip
        except KeyboardInterrupt:
            stopping()
            if not mark.at:  # the checkpoint not read yet: the caller knows as much
                raise
            raise Interrupted(mark.at, mark.kept) from None


def _run(
    cfg: LoopConfig,
    algorithm: FedAlgorithm,
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
) -> RunResult:
    if algorithm.prepare_model is not None:
        model = algorithm.prepare_model(model, cfg.seed).to(dev)
    state = (
        checkpoint.load(checkpoint_path, config_hash, map_location=dev)
        if (resume and checkpoint_path)
        else None
    )
    resumed_from = state.round_ if state is not None else 0
    mark.at, mark.kept = resumed_from + 1, None if checkpoint_path is None else resumed_from
    if state is None:  # round 0: the server's initial state, an algorithm's warm start
        state = initial_state(algorithm, model, data, cfg.seed, cfg.local, config_hash)
    if tracker is not None and state.run_id is None:
        state.run_id = tracker.run_id
    if checkpoint_path is not None and resumed_from == 0:  # a kill before round 1 keeps the run id
        _save(state, checkpoint_path, mark)
    ledger = Ledger(list(state.ledger_rows))
    cum_bits = sum(r[3] + r[4] + r[5] for r in ledger.rows)
    cum_up_bits = sum(r[3] + r[4] + r[5] for r in ledger.rows if r[2] == "up")
    backend = Backend(
        cfg.backend, algorithm, model, data, cfg.local, cfg.chunk_size, precision=cfg.precision
    )
    sim = (
        None
        if cfg.system is None
        else timed.SystemRun.build(
            cfg.system, model, data, cfg.seed, cfg.data_root, sparse=algorithm.sparse_compute
        )
    )

    for round_ in range(state.round_ + 1, cfg.rounds + 1):
        mark.at = round_
        t_round = time.perf_counter()
        metrics, cum_bits, cum_up_bits = _one_round(
            cfg, algorithm, model, data, compressor, state, ledger, round_, cum_bits, cum_up_bits,
            backend, sim,
        )  # fmt: skip
        metrics["time/round_s"] = time.perf_counter() - t_round
        state.round_ = round_
        state.round_rows.append({"round": round_, **metrics})
        state.ledger_rows = ledger.rows
        if tracker is not None:
            tracker.log_round(round_, metrics)
        if progress is not None:
            progress(round_, metrics)
        if (
            checkpoint_path is not None
            and (round_ % cfg.checkpoint_every == 0)
            and round_ < cfg.rounds
        ):
            _save(state, checkpoint_path, mark)
        if os.environ.get(CRASH_ENV) == str(round_):
            os.kill(os.getpid(), signal.SIGKILL)
    final = {k: v.detach().clone() for k, v in algorithm.global_params(state.server).items()}
    return RunResult(
        state, final, ledger, resumed_from, backend=backend.effective, checkpoint_round=mark.kept
    )


def _save(state: checkpoint.RunState, path: Path, mark: _Mark) -> None:
    """Checkpoint ``state`` (its round); a Ctrl-C meanwhile waits until it is saved and marked."""
    with interrupts_deferred():
        checkpoint.save(state, path)
        mark.kept = state.round_


def _one_round(
    cfg: LoopConfig,
    algorithm: FedAlgorithm,
    model: nn.Module,
    data: FederatedTensors,
    compressor: Compressor,
    state: checkpoint.RunState,
    ledger: Ledger,
    round_: int,
    cum_bits: int,
    cum_up_bits: int,
    backend: Backend,
    sim: timed.SystemRun | None = None,
) -> tuple[dict[str, float | None], int, int]:
    rctx = RoundContext(round_, torch_generator(cfg.seed, Stream.SERVER, round_), cfg.seed, model)
    start_s = timed.elapsed_s(state.round_rows)  # simulated seconds before this round (system only)
    online = 0
    if sim is None:
        cohort = sample_cohort(cfg.seed, round_, data.num_clients, cfg.clients_per_round)
    else:  # K(1 + f) among the clients online now
        cohort, online = sim.cohort(cfg.seed, round_, start_s, cfg.clients_per_round)
    uplinks: list[Uplink] = []
    payloads: list[Payload] = []
    up_bits = down_bits = up_dense_bits = 0
    numel = dense_numel(model)  # the full model, without ProgFed's temporary heads
    train_s: list[float] = []
    losses: list[tuple[float, int]] = []
    client_metrics: list[Mapping[str, float]] = []
    skipped: list[int] = []  # clients that diverged (train.on_divergence: skip)
    local_due = round_ % cfg.local_eval_every == 0 or round_ == cfg.rounds

    def state_of(cid: int) -> Any:
        record = state.clients.get(cid)
        return record.state if record is not None else algorithm.init_client(cid)

    def inputs(clients: Sequence[int], local: LocalConfig) -> RoundInputs:
        return RoundInputs(
            clients, algorithm, state_of, state.server, rctx, model, data, local, cfg.seed
        )

    def compressor_in(cid: int) -> Any:
        record = state.clients.get(cid)
        return record.compressor_state if record is not None else compressor.init()

    def encode(turn: Turn) -> tuple[Payload, Any, float]:
        t0 = time.perf_counter()
        payload, comp_state = compressor.encode(
            turn.result.uplink, compressor_in(turn.client_id), turn.generator, round_
        )
        return payload, comp_state, turn.seconds + time.perf_counter() - t0

    def take(
        turn: Turn, payload: Payload, comp_state: Any, seconds: float, extra: dict[str, Any]
    ) -> None:
        """Client ``turn`` aggregated: its uplink decoded, its model evaluated or kept, its
        state stored, its row written."""
        nonlocal up_dense_bits
        cid, decoded_down, result = turn.client_id, turn.decoded_down, turn.result
        record = state.clients.get(cid)
        train_s.append(seconds)
        up_dense_bits += bits.dense(numel)  # the dense model
        decoded_up = payload.decode()
        uplinks.append(Uplink(cid, result.num_examples, decoded_up))
        payloads.append(payload)
        uploaded = result.local_params
        if payload is not result.uplink and algorithm.uploaded_model is not None:
            uploaded = algorithm.uploaded_model(decoded_down, decoded_up)  # what the server got
        local: tuple[float | None, float | None, int | None]
        if local_due:  # evaluated now: its record holds the result
            local = local_eval.evaluate_upload(model, uploaded, data, cid, cfg.eval_batch_size)
            state.clients[cid] = ClientRecord(result.state, comp_state, *local)
        else:  # kept until local evaluation is due; its last result is reused until then
            state.clients[cid] = ClientRecord(
                result.state,
                comp_state,
                *(local_eval.last_result(record)),
                pending=local_eval.copy_to(uploaded, torch.device("cpu")),
                pending_row=len(state.client_rows),
            )
            local = (None, None, None)  # this upload's row: filled in when evaluated
        loss = result.metrics.get("train/loss", math.nan)
        why = diverged(result.metrics.get("train/loss"), decoded_up, cfg.divergence_loss)
        if why is not None:
            if cfg.on_divergence == "stop":
                raise DivergenceError(
                    f"round {round_}: client {cid} diverged: {why}. Lower train.local.lr "
                    f"(now {cfg.local.lr:g}), "
                    "or set train.on_divergence: skip to leave such clients out"
                )
            skipped.append(cid)  # sent and charged, but left out of the aggregation
            uplinks.pop()
            payloads.pop()
        else:
            client_metrics.append(result.metrics)
            losses.append((loss, result.num_examples))
        state.client_rows.append(
            {
                "round": round_,
                "client_id": cid,
                "num_examples": result.num_examples,
                "train_s": seconds,
                "train_loss": loss,
                "local_accuracy": local[0],
                "local_loss": local[1],
                "test_n": local[2],
                **extra,
            }
        )

    turns = backend.turns(inputs(cohort, cfg.local)) if cohort else iter(())  # 1.-3.
    settled: timed.Settled | None = None
    if sim is None:
        for turn in turns:
            down_bits += ledger.record(round_, turn.client_id, "down", turn.down)
            payload, comp_state, seconds = encode(turn)
            up_bits += ledger.record(round_, turn.client_id, "up", payload)
            take(turn, payload, comp_state, seconds, {})
    else:  # every client timed from its bits and work, then the round settled

        def train(cid: int, local: LocalConfig) -> Turn:
            (turn,) = backend.turns(inputs([cid], local))
            return turn

        up_bits, down_bits, settled = timed.play_round(
            sim, turns, ledger=ledger, round_=round_, k=cfg.clients_per_round, local=cfg.local,
            start_s=start_s, encode=encode, train=train, take=take, client_rows=state.client_rows,
        )  # fmt: skip
    if not uplinks and (sim is None or skipped):
        raise DivergenceError(
            f"round {round_}: every client diverged ({len(skipped)} skipped). Lower train.local.lr"
        )
    t_server = time.perf_counter()
    if compressor.server_hook is not None and uplinks:  # e.g. SignSGD: uplinks become the vote
        hooked = compressor.server_hook(payloads)
        uplinks = [
            Uplink(u.client_id, u.num_examples, t) for u, t in zip(uplinks, hooked, strict=True)
        ]
    if uplinks:  # (a system round where no client made it leaves the server as it was)
        state.server = algorithm.server_update(state.server, uplinks, rctx)  # 4. server
    server_s = time.perf_counter() - t_server
    cum_bits += up_bits + down_bits
    cum_up_bits += up_bits
    metrics: dict[str, float | None] = {
        **comm_metrics(
            up_bits, down_bits, up_dense_bits, cum_bits, cum_up_bits, numel, len(cohort), round_
        ),
        "train/loss": weighted([lo for lo, _ in losses], [n for _, n in losses]),
        "time/client_s": float(np.mean(train_s)) if train_s else None,
        "time/client_max_s": float(np.max(train_s)) if train_s else None,
        "time/server_s": server_s,
    }
    if settled is not None:
        metrics.update(timed.round_metrics(settled, len(cohort), online, start_s))
    if skipped:
        metrics["train/diverged_clients"] = float(len(skipped))
    if local_due:
        local_eval.evaluate_pending(state, model, data, cfg.eval_batch_size)
        metrics.update(local_eval.local_metrics(state.clients, data.num_clients))
    metrics.update(aggregate_client_metrics(client_metrics))
    metrics.update(
        {
            f"{algorithm.name}/{k}" if "/" not in k else k: v
            for k, v in algorithm.server_metrics(state.server).items()
        }
    )
    params = algorithm.global_params(state.server)
    dens = density(params)
    metrics["model/density"] = dens
    metrics["model/sparsity"] = 1.0 - dens
    if round_ % cfg.eval_every == 0 or round_ == cfg.rounds:  # 5. evaluate
        members = split_members(params)
        batch = cfg.eval_batch_size
        g = evaluate_global(model, members, data, batch_size=batch, topk=(cfg.topk,)).union
        metrics["global/accuracy"] = g.accuracy
        metrics["global/loss"] = g.loss
        metrics["topk/accuracy"] = g.topk.get(cfg.topk)
        if len(members) > 1:  # an ensemble: each member's accuracy too
            for k, member in enumerate(members):
                one = evaluate_global(model, member, data, batch_size=batch).union
                metrics[f"global/member{k}/accuracy"] = one.accuracy
    return metrics, cum_bits, cum_up_bits
