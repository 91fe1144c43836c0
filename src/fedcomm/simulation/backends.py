"""Backends: how step 3 of the round loop (every sampled client's local work) runs.

* ``sequential`` (the reference): client after client, broadcast -> decode -> ``client_update``
  on the one reused model structure;
* ``vectorized``: every client's broadcast is decoded and turned into a local-training job
  (``client_job``), the jobs train together in chunks of ``chunk_size`` clients
  (:mod:`fedcomm.simulation.vectorized`), then each job is finished in cohort order;
* ``auto``: one of the two by the rule of :mod:`fedcomm.simulation.auto_backend` (model kind and
  device), logged in one line.

Both yield one :class:`Turn` per client in cohort order; the loop then encodes, accounts and
evaluates exactly as before, so ledgers, generators' streams and metrics line up. An algorithm
without ``client_job`` (or a model whose step cannot be vmapped) runs sequentially on the
vectorized backend, and the run's log says so once, with the reason. Under ``torchrun``
(:mod:`fedcomm.simulation.shard`) each rank trains its share of the cohort on the backend and the
turns of every rank are gathered, so the loop sees the whole cohort, in order, as in one process.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from fedcomm.algorithms.core import ClientContext, ClientResult, FedAlgorithm, RoundContext
from fedcomm.algorithms.core.jobs import LocalProgram, grad_fn, with_dropout
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.payload import Payload
from fedcomm.models import dropout
from fedcomm.models.lstm import unrolled
from fedcomm.seeding import Stream, torch_generator
from fedcomm.simulation import allocator, auto_backend, device, shard, vectorized
from fedcomm.simulation.data import FederatedTensors

log = logging.getLogger("fedcomm.backend")

BackendName = Literal["sequential", "vectorized", "auto"]
BACKENDS: tuple[str, ...] = ("sequential", "vectorized", "auto")


@dataclass(frozen=True)
class Turn:
    """One client's part of a round, up to its (not yet encoded) uplink."""

    client_id: int
    down: Payload
    decoded_down: Mapping[str, Tensor]
    generator: torch.Generator  # the client's (seed, CLIENT, round, client) stream, as left
    result: ClientResult
    seconds: float  # decode + local work (its share of a batched chunk on the vectorized backend)
    # nonzero entries of each tensor of its local model, for a client another rank trained
    # (its local model is not sent here: what the clock charges sparse compute from)
    nonzero: Mapping[str, int] | None = None


StateOf = Callable[[int], Any]  # client id -> its algorithm state (the store's or a fresh one)


class Backend:
    """The chosen backend for one run: ``requested`` is the configured name, ``name`` what it
    means here (``auto`` resolved), ``effective`` what actually runs (after a fallback)."""

    def __init__(
        self,
        name: str,
        algorithm: FedAlgorithm[Any],
        model: nn.Module,
        data: FederatedTensors,
        local: LocalConfig,
        chunk_size: int | str,
        *,
        precision: str = "fp32",
        sharded: shard.Shard | None = None,
        compile: str = "none",
    ) -> None:
        if name not in BACKENDS:
            raise ValueError(f"train.backend: {name!r} is not one of {list(BACKENDS)}")
        self.device = next(model.parameters()).device
        self.requested = name
        self.shard = sharded  # under torchrun: this rank trains its share of each cohort
        name = auto_backend.resolve(name, model, self.device)  # "auto": the rule's choice
        self.name = name
        self.precision = precision
        self.chunk_size = chunk_size
        self.chunk_sizes: dict[tuple[Any, ...], int] = {}  # chunk_size auto: kept for the run
        if compile != "none" and dropout.layers(model):
            log.warning(
                "train.compile: %s: the model's dropout layers take their masks by a patched "
                "forward, which torch.compile does not trace; the batched step runs uncompiled",
                compile,
            )
            compile = "none"
        self.compiler = vectorized.Compiler(compile)  # train.compile: its graphs kept for the run
        allocator.tune()
        self.fallback: str | None = None
        if name == "vectorized":
            self.fallback = unbatched_reason(algorithm, model, data, local)
            if self.fallback is not None:
                log.warning(
                    "backend vectorized: %s runs sequentially: %s", algorithm.name, self.fallback
                )
        self.effective = "sequential" if name == "sequential" or self.fallback else "vectorized"
        self.threads = (
            client_threads(model, data, local)
            if self.effective == "sequential" and self.device.type == "cpu"
            else torch.get_num_threads()
        )

    def turns(self, r: RoundInputs) -> Iterator[Turn]:
        """The round's clients, in cohort order, up to their (not yet encoded) uplinks; local
        training under ``train.precision``'s autocast."""

        def autocast() -> AbstractContextManager[None]:  # (never held across a yield)
            return device.precision(self.device, self.precision)

        def local(r: RoundInputs) -> Iterator[Turn]:
            if self.effective == "sequential":
                return _sequential(r, self.threads, autocast)
            return _vectorized(r, self.chunk_size, autocast, self.chunk_sizes, self.compiler)

        if self.shard is None:
            return local(r)
        return _sharded(r, self.shard, local)


@dataclass(frozen=True)
class RoundInputs:
    """What step 3 of a round needs: the cohort and everything its clients read."""

    cohort: Sequence[int]
    algorithm: FedAlgorithm[Any]
    state_of: StateOf
    server: Any  # the server state (fixed during the round)
    rctx: RoundContext
    model: nn.Module
    data: FederatedTensors
    local: LocalConfig
    seed: int

    @property
    def model_device(self) -> torch.device:
        return next(self.model.parameters()).device

    def start(self, cid: int) -> tuple[Any, Payload, ClientContext]:
        """Client ``cid``'s state, its downlink and its context (generator ``(seed, CLIENT,
        round, cid)``)."""
        cstate = self.state_of(cid)
        down = self.algorithm.broadcast(self.server, cid, cstate, self.rctx)
        gen = torch_generator(self.seed, Stream.CLIENT, self.rctx.round_, cid)
        return (
            cstate,
            down,
            ClientContext(self.rctx.round_, cid, self.model, self.local, gen, self.seed),
        )


Autocast = Callable[[], AbstractContextManager[None]]


def _sequential(r: RoundInputs, threads: int, autocast: Autocast) -> Iterator[Turn]:
    """One client after the other, its local work on ``threads`` intra-op threads (see
    :func:`client_threads`); the server update and global evaluation, after the last client, run
    with the process's threads again."""
    before = torch.get_num_threads()
    torch.set_num_threads(min(threads, before))
    try:
        for cid in r.cohort:
            cstate, down, cctx = r.start(cid)
            t0 = time.perf_counter()
            decoded = down.decode()
            with autocast():
                result = r.algorithm.client_update(decoded, cstate, r.data.train[cid], cctx)
            device.synchronize(r.model_device)
            yield Turn(cid, down, decoded, cctx.generator, result, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)


SMALL_STEP_FLOPS = 50e6  # forward FLOPs of one local batch below which one thread is faster


def client_threads(model: nn.Module, data: FederatedTensors, local: LocalConfig) -> int:
    """Intra-op threads for one client's sequential local work: 1 when a local batch's forward
    pass is under :data:`SMALL_STEP_FLOPS` (the MLP's batch of 10: 2 MFLOP; a second thread's
    hand-off then costs more than it saves, 1 thread is ~1.2x faster on 2 cores), else the
    process's (the LeNet-like CNN's batch of 32: 270 MFLOP, where 2 threads are ~1.4x faster).
    Measured with ``benchmarks/backends.py``; FLOPs counted on one real example. A process with
    one thread has nothing to choose, and skips the count (its first use loads torch's operator
    decompositions: about a second)."""
    source = next((d for d in data.train if d.num_examples), None)
    if source is None or torch.get_num_threads() == 1:
        return torch.get_num_threads()
    was_training = model.training
    model.eval()  # no batch-norm statistics updated, no dropout draws
    try:
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(source.x[:1])
    finally:
        model.train(was_training)
    # at least 2 FLOPs per parameter per example: FlopCounterMode counts no recurrent kernel
    # (an LSTM's aten::lstm), which would otherwise look free
    numel = sum(p.numel() for p in model.parameters())
    per_batch = max(counter.get_total_flops(), 2 * numel) * local.batch_size
    return 1 if per_batch < SMALL_STEP_FLOPS else torch.get_num_threads()


def _vectorized(
    r: RoundInputs,
    chunk_size: int | str,
    autocast: Autocast,
    sizes: dict[tuple[Any, ...], int],
    compiler: vectorized.Compiler,
) -> Iterator[Turn]:
    client_job = r.algorithm.execution.client_job
    assert client_job is not None
    prepared = []
    for cid in r.cohort:  # every broadcast and job first (the server state is fixed in a round)
        cstate, down, cctx = r.start(cid)
        t0 = time.perf_counter()
        decoded = down.decode()
        job = with_dropout(client_job(decoded, cstate, r.data.train[cid], cctx), cctx)
        prepared.append((cid, down, decoded, cctx, job, time.perf_counter() - t0))
    t0 = time.perf_counter()
    with autocast():
        trained = vectorized.train_jobs(
            [p[4] for p in prepared], r.model, r.local, chunk_size, sizes, compiler
        )
    device.synchronize(r.model_device)  # (an asynchronous device's work counts in the share)
    share = (time.perf_counter() - t0) / max(1, len(prepared))
    for (cid, down, decoded, cctx, job, prep_s), res in zip(prepared, trained, strict=True):
        t0 = time.perf_counter()
        result = job.finish(res)
        seconds = prep_s + share + time.perf_counter() - t0
        yield Turn(cid, down, decoded, cctx.generator, result, seconds)


def _sharded(
    r: RoundInputs, rank: shard.Shard, local: Callable[[RoundInputs], Iterator[Turn]]
) -> Iterator[Turn]:
    """This rank's share of the cohort trained by ``local``, then every rank's turns gathered
    and yielded in cohort order. What travels: each client's result, its generator's state and
    its local model's nonzero counts (:attr:`Turn.nonzero`: every rank's clock charges the same
    sparse compute) to every rank, its local model (for local evaluation) to rank 0 only; each
    rank rebuilds a remote client's downlink itself (the broadcast is a function of the server
    state)."""
    shares = shard.assign([r.data.train[c].num_examples for c in r.cohort], rank.world)
    turns = list(local(replace(r, cohort=[r.cohort[i] for i in shares[rank.rank]])))
    mine = [
        (t.client_id, t.generator.get_state(), replace(t.result, local_params={}), t.seconds,
         {k: int(torch.count_nonzero(v)) for k, v in t.result.local_params.items()})
        for t in turns
    ]  # fmt: skip
    everyone = shard.gather(rank, mine, r.model_device)
    models = shard.gather(
        rank, [t.result.local_params for t in turns], r.model_device, to_all=False
    )
    assert everyone is not None
    own = {t.client_id: t for t in turns}
    ordered = shard.in_order(shares, everyone)
    params = shard.in_order(shares, models) if models is not None else None
    for cid, state, result, seconds, nonzero in ordered:
        local_params = next(params) if params is not None else {}
        if cid in own:
            yield own[cid]
            continue
        _, down, _ = r.start(cid)
        gen = torch.Generator()
        gen.set_state(state)
        result = replace(result, local_params=local_params)
        yield Turn(cid, down, down.decode(), gen, result, seconds, nonzero)


def unbatched_reason(
    algorithm: FedAlgorithm[Any], model: nn.Module, data: FederatedTensors, local: LocalConfig
) -> str | None:
    """Why this run's clients cannot train as one batch (None: they can)."""
    if algorithm.execution.client_job is None:
        return algorithm.execution.unbatched or "it has no batched form (no client_job)"
    return model_unbatched_reason(model, data, local)


def model_unbatched_reason(
    model: nn.Module, data: FederatedTensors, local: LocalConfig
) -> str | None:
    """Probe: one vmapped gradient over two copies of the model on one real example."""
    if any(True for _ in model.buffers()):
        names = sorted(n for n, _ in model.named_buffers())
        return f"the model has buffers ({', '.join(names[:3])}) that a batched step cannot carry"
    unsupported = dropout.unsupported(model)
    if unsupported is not None:
        return unsupported
    source = next((d for d in data.train if d.num_examples), None)
    if source is None:
        return None
    params = {k: torch.stack([v.detach(), v.detach()]) for k, v in model.named_parameters()}
    x = torch.stack([source.x[:1], source.x[:1]])
    y = torch.stack([source.y[:1], source.y[:1]])
    masks = dropout.kept_all(dropout.sites(model, source.x[:1]), 1)  # the layers' given masks
    masks = {k: torch.stack([v, v]).to(x.device) for k, v in masks.items()}
    phase = grad_fn(model, LocalProgram(), local, functional=True)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with unrolled(model):  # as the vectorized backend runs it
                torch.func.vmap(phase, in_dims=(0, 0, 0, 0, None))(params, masks, x, y, None)
    except Exception as err:  # any failure means: not batchable; say why
        text = str(err).strip()
        if "random operation" in text:
            return (
                "its model draws random numbers in the forward pass outside nn.Dropout layers "
                "(e.g. F.dropout): a batched step cannot replay each client's draws"
            )
        first = text.splitlines()[0] if text else type(err).__name__
        return f"its model's step does not vmap ({type(err).__name__}: {first[:160]})"
    slow = [str(w.message) for w in caught if "batching rule" in str(w.message)]
    if slow:  # vmap would run a per-client loop in place of a batched kernel
        op = slow[0].split("batching rule for ")[-1].split(".")[0]
        return f"torch has no batching rule for {op} in its model (vmap would loop over clients)"
    return None
