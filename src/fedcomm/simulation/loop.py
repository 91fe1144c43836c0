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
the clients in cohort order, so the rest of the round is the same code.
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
from torch import Tensor, nn

from fedcomm.algorithms.core import (
    FedAlgorithm,
    RoundContext,
    Uplink,
    WarmStartContext,
    split_members,
)
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm import bits
from fedcomm.comm.codecs import Compressor
from fedcomm.comm.ledger import Ledger, Status
from fedcomm.comm.payload import Payload
from fedcomm.evaluation.metrics import evaluate
from fedcomm.models.progressive import dense_numel
from fedcomm.seeding import Stream, numpy_rng, torch_generator
from fedcomm.simulation import checkpoint, device, timed
from fedcomm.simulation.backends import Backend, RoundInputs, Turn
from fedcomm.simulation.data import FederatedTensors
from fedcomm.simulation.global_eval import evaluate_global
from fedcomm.system.config import SystemConfig
from fedcomm.types import Params

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


class DivergenceError(RuntimeError):
    """A client's training loss is non-finite or exploded, or its update is non-finite."""


def diverged(loss: float | None, update: Mapping[str, Tensor], limit: float) -> str | None:
    """Why a client's round diverged, or None: a loss that is NaN, infinite or above ``limit``
    (``None``: the algorithm reports none), or a non-finite value in its decoded update."""
    if loss is not None and not loss <= limit:  # NaN compares false
        return f"training loss {loss:.4g}" + ("" if math.isnan(loss) else f" (limit {limit:g})")
    floats = [(n, t) for n, t in update.items() if t.is_floating_point() and t.numel()]
    if not floats:
        return None
    # fast path: a finite sum means every value is finite (NaN and ±inf propagate); a non-finite
    # sum may also be an overflow of huge finite values, so only then is each value checked
    # (one device for the stack: an update may keep a scalar, AFD's uploaded loss, on the CPU)
    device = floats[0][1].device
    sums = torch.stack([t.sum().to(device) for _, t in floats])
    if bool(torch.isfinite(sums).all()):  # one read back per client
        return None
    bad = next((n for n, t in floats if not bool(torch.isfinite(t).all())), None)
    return None if bad is None else f"a non-finite value in its update of {bad}"


@dataclass
class ClientRecord:
    """What the client store keeps per client between its participations."""

    state: Any = None
    compressor_state: Any = None
    local_accuracy: float | None = None  # of its last upload, on its own test split
    local_loss: float | None = None
    test_n: int = 0
    pending: Any = None  # its last upload on the CPU, not yet evaluated (local_eval_every > 1)
    pending_row: int | None = None  # its index in the run's client rows


@dataclass(frozen=True)
class RunResult:
    state: checkpoint.RunState
    final_params: Params
    ledger: Ledger
    resumed_from: int = 0
    timings: dict[str, float] = field(default_factory=dict)
    backend: str = "sequential"  # the backend that actually ran the clients


def sample_cohort(seed: int, round_: int, num_clients: int, k: int) -> list[int]:
    """``k`` distinct clients for round ``round_``, sorted."""
    if k > num_clients:
        raise ValueError(f"train.clients_per_round={k} exceeds the {num_clients} clients")
    rng = numpy_rng(seed, Stream.SAMPLING, round_)
    return sorted(int(c) for c in rng.choice(num_clients, size=k, replace=False))


def density(params: Mapping[str, Tensor]) -> float:
    nnz = sum(int(torch.count_nonzero(v)) for v in params.values())
    numel = sum(v.numel() for v in params.values())
    return nnz / numel if numel else 1.0


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
    """
    dev = device.resolve(cfg.device)
    with device.run_on(dev):
        return _run(
            cfg, algorithm, model.to(dev), data.to(dev), compressor, dev,
            config_hash=config_hash, checkpoint_path=checkpoint_path, tracker=tracker,
            resume=resume, progress=progress,
        )  # fmt: skip


def _run(
    cfg: LoopConfig,
    algorithm: FedAlgorithm,
    model: nn.Module,
    data: FederatedTensors,
    compressor: Compressor,
    dev: torch.device,
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
    if state is None:
        init = {k: v.detach().clone() for k, v in model.named_parameters()}
        state = checkpoint.RunState(config_hash=config_hash)
        gen = torch_generator(cfg.seed, Stream.SERVER, 0)
        state.server = algorithm.init_server(init, RoundContext(0, gen, cfg.seed, model))
        if algorithm.warm_start is not None:  # e.g. GraSP, PruneFL phase one: round 0
            warm = Ledger([])
            wctx = WarmStartContext(gen, cfg.seed, model, cfg.local)
            state.server, messages = algorithm.warm_start(state.server, data.train, wctx)
            for cid, direction, payload in messages:
                warm.record(0, cid, direction, payload)
            state.ledger_rows = warm.rows
    if tracker is not None and state.run_id is None:
        state.run_id = tracker.run_id
    if checkpoint_path is not None and resumed_from == 0:
        checkpoint.save(state, checkpoint_path)  # round 0: a kill before round 1 keeps the run id
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
            checkpoint.save(state, checkpoint_path)
        if os.environ.get(CRASH_ENV) == str(round_):
            os.kill(os.getpid(), signal.SIGKILL)
    final = {k: v.detach().clone() for k, v in algorithm.global_params(state.server).items()}
    return RunResult(state, final, ledger, resumed_from, backend=backend.effective)


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
    start_s = elapsed_s(state)  # simulated seconds before this round (system only)
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
            local = _local_eval(model, uploaded, data, cid, cfg.eval_batch_size)
            state.clients[cid] = ClientRecord(result.state, comp_state, *local)
        else:  # kept until local evaluation is due; its last result is reused until then
            state.clients[cid] = ClientRecord(
                result.state,
                comp_state,
                *(_last_result(record)),
                pending=_on(uploaded, torch.device("cpu")),
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
        clocked: list[timed.Timed] = []
        walls: dict[int, float] = {}
        for turn in turns:
            d = ledger.record(round_, turn.client_id, "down", turn.down)
            down_bits += d
            payload, comp_state, walls[turn.client_id] = encode(turn)
            clocked.append(timed.time_turn(sim, turn, payload, comp_state, d, cfg.local, start_s))

        def retrain(t: timed.Timed, steps: int) -> timed.Timed:  # partial work: the first steps
            local = LocalConfig(**{**cfg.local.model_dump(), "epochs": None, "steps": steps})
            (turn,) = backend.turns(inputs([t.turn.client_id], local))
            payload, comp_state, walls[turn.client_id] = encode(turn)
            return timed.time_turn(
                sim, turn, payload, comp_state, t.down_bits, cfg.local, start_s, steps
            )

        settled = timed.settle(sim, clocked, cfg.clients_per_round, start_s, retrain)
        for t in settled.accepted:
            cid = t.turn.client_id
            up_bits += ledger.record(round_, cid, "up", t.payload)
            status = "partial_work" if cid in settled.partial else "aggregated"
            take(t.turn, t.payload, t.comp_state, walls[cid], _sim_row(t, status))
        for t, sent in settled.dropped:
            cut: Status = "partial" if sent else "not_sent"
            up_bits += ledger.record(
                round_, t.turn.client_id, "up", t.payload, status=cut, sent_bits=sent
            )
            state.client_rows.append(
                {"round": round_, "client_id": t.turn.client_id,
                 "num_examples": t.turn.result.num_examples, **_sim_row(t, "dropped")}
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
        "comm/up_bytes": bits.to_bytes(up_bits),
        "comm/down_bytes": bits.to_bytes(down_bits),
        "comm/cum_bytes": bits.to_bytes(cum_bits),
        "comm/cum_gib": bits.to_gib(cum_bits),
        "comm/cum_up_bytes": bits.to_bytes(cum_up_bits),
        "comm/up_ratio": up_dense_bits / up_bits if up_bits else None,  # dense model / sent
        # all bits so far / dense FedAvg's (model down and up per client) over as many rounds
        "comm/cost_vs_dense": cum_bits / (2 * bits.dense(numel) * max(1, len(cohort)) * round_),
        "train/loss": _weighted([lo for lo, _ in losses], [n for _, n in losses]),
        "time/client_s": float(np.mean(train_s)) if train_s else None,
        "time/client_max_s": float(np.max(train_s)) if train_s else None,
        "time/server_s": server_s,
    }
    if sim is not None:
        metrics.update(_sim_metrics(settled, len(cohort), online, start_s))
    if skipped:
        metrics["train/diverged_clients"] = float(len(skipped))
    if local_due:
        _evaluate_pending(state, model, data, cfg.eval_batch_size)
        metrics.update(_local_metrics(state.clients, data.num_clients))
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


def aggregate_client_metrics(per_client: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The round's value of each algorithm-specific client metric: max for ``*_max`` keys, min
    for ``*_min``, else the unweighted mean over clients (``train/loss`` is handled apart)."""
    keys = sorted({k for m in per_client for k in m} - {"train/loss"})
    out: dict[str, float] = {}
    for key in keys:
        values = [float(m[key]) for m in per_client if key in m and not math.isnan(float(m[key]))]
        if not values:
            continue
        if key.endswith("_max"):
            out[key] = max(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        else:
            out[key] = float(np.mean(values))
    return out


def _weighted(values: list[float], weights: list[int]) -> float | None:
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if not math.isnan(v) and w > 0]
    if not pairs:
        return None
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)


LocalResult = tuple[float | None, float | None, int]  # accuracy, loss, test examples


def _local_eval(
    model: nn.Module, params: Any, data: FederatedTensors, cid: int, batch_size: int
) -> LocalResult:
    """Client ``cid``'s model ``params`` on its own test split."""
    test = data.test[cid]
    local = evaluate(model, params, test.x, test.y, batch_size=batch_size)
    return (local.accuracy if local.n else None, local.loss if local.n else None, local.n)


def _last_result(record: ClientRecord | None) -> LocalResult:
    if record is None:
        return (None, None, 0)
    return (record.local_accuracy, record.local_loss, record.test_n)


def _on(params: Any, dev: torch.device) -> Any:
    """``params`` (a mapping of tensors, or a list of them) copied to ``dev``."""
    if isinstance(params, Mapping):
        return {k: v.detach().to(dev, copy=True) for k, v in params.items()}
    return [_on(p, dev) for p in params]


def _evaluate_pending(
    state: checkpoint.RunState, model: nn.Module, data: FederatedTensors, batch_size: int
) -> None:
    """Evaluate every upload kept since the last local evaluation (clients in id order): its
    result goes to the client's record and to the client row of the round it was uploaded."""
    dev = data.global_test.x.device
    for cid in sorted(c for c, r in state.clients.items() if r.pending is not None):
        record = state.clients[cid]
        result = _local_eval(model, _on(record.pending, dev), data, cid, batch_size)
        record.local_accuracy, record.local_loss, record.test_n = result
        if record.pending_row is not None:
            row = state.client_rows[record.pending_row]
            row["local_accuracy"], row["local_loss"], row["test_n"] = result
        record.pending, record.pending_row = None, None


def _local_metrics(
    clients: Mapping[int, ClientRecord], num_clients: int
) -> dict[str, float | None]:
    """Local accuracy over clients that have uploaded (unweighted and test-size weighted)."""
    seen = [r for r in clients.values() if r.local_accuracy is not None]
    if not seen:
        return {"local/accuracy": None, "local/accuracy_weighted": None, "local/coverage": 0.0}
    accs = [float(r.local_accuracy) for r in seen if r.local_accuracy is not None]
    return {
        "local/accuracy": float(np.mean(accs)),
        "local/accuracy_weighted": _weighted(accs, [r.test_n for r in seen]),
        "local/coverage": len(clients) / num_clients,
    }


def elapsed_s(state: checkpoint.RunState) -> float:
    """Simulated seconds the run has spent so far (0 without a ``system`` section)."""
    if not state.round_rows:
        return 0.0
    return float(state.round_rows[-1].get("time/sim_elapsed_s") or 0.0)


def _sim_row(t: timed.Timed, status: str) -> dict[str, Any]:
    """A client's simulated round in its client row (seconds from the round's start)."""
    c = t.time
    return {
        "status": status,
        "local_steps": len(t.sizes),
        "sim_down_s": c.down_s,
        "sim_compute_s": c.compute_s,
        "sim_up_s": c.up_s,
        "sim_finish_s": c.finish_s,
    }


def _sim_metrics(
    settled: timed.Settled | None, sampled: int, online: int, start_s: float
) -> dict[str, float | None]:
    round_s = settled.round_s if settled is not None else 0.0
    finished = len(settled.accepted) if settled is not None else 0
    return {
        "time/sim_round_s": round_s,
        "time/sim_elapsed_s": start_s + round_s,
        "system/online": float(online),
        "system/sampled": float(sampled),
        "system/finished": float(finished),
        "system/dropped": float(sampled - finished),
        "system/partial": float(len(settled.partial)) if settled is not None else 0.0,
    }
