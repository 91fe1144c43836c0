"""PruneFL: adaptive unstructured pruning, first on one client, then federated.

Jiang et al., "Model Pruning Enables Efficient Federated Learning on Edge Devices", IEEE TNNLS
2022 (arXiv:1909.12326), as FedDST's official code runs it (bibikar/feddst @ 25d6184:
``prunefl.py``, ``models.prunefl_readjust``). Maskable: the ``weight`` of every Conv/Linear
layer (first and last included); biases and everything else are dense and never masked.

Readjustment (:func:`readjust`): a new mask from the gradients ``g`` of the maskable entries,
their per-entry times ``t_l`` and the pruned fraction ``p`` (``p_initial`` in phase one, then
:func:`prune_fraction`): :mod:`fedcomm.algorithms.prunefl.readjust` (the rule in full).

Per-entry times ``t_l`` (``layer_time``: ``uniform``, ``flops`` or a measured list) and the
maskable layers: :mod:`fedcomm.algorithms.prunefl.times`; the messages and masked local training:
:mod:`fedcomm.algorithms.prunefl.client`.

* Phase one (``warm_start``, before round 1): one client drawn uniformly from those with data
  runs up to ``initial_rounds`` local rounds (each: local training per ``train.local``) from the
  initial model, readjusting with its last-minibatch gradient in local rounds
  ``first_readjust, first_readjust + initial_readjust_every, …``; it stops early once
  ``early_stop_patience`` consecutive readjustments each changed less than ``early_stop_churn``
  of the mask. Its resulting sparse model becomes the global model. Charged once, at round 0:
  the client's upload of the active values, the biases and the mask (1 bit per maskable entry);
  the initial model it starts from is a seed (free), as in FedDST.
* Round ``r``: the server sends the active values and the dense parameters, plus the mask only
  when it changed since this client last got one (clients start holding the all-ones mask, as in
  FedDST). The client trains only active weights (masked-out weights zeroed after every step)
  and uploads its update on the active entries and the dense parameters; in rounds
  ``first_readjust + k·readjust_every`` also its dense last-minibatch gradient of every maskable
  entry. Clients never change the mask. The bits: :mod:`fedcomm.algorithms.prunefl.client`.
* Server: ``w ← mask ⊙ (w + server_opt(Σ_k n_k Δ_k / Σ_k n_k))`` (the default ``sgd``, lr 1, is
  the weighted average of the active values); in readjustment rounds it then averages the
  gradients (unweighted, as the code) and readjusts the mask; weights leaving it are zeroed,
  entering ones start at 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

import torch
from pydantic import Field, PositiveFloat
from torch import Tensor

from fedcomm.algorithms import core
from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm
from fedcomm.algorithms.core.context import (
    ClientContext,
    ClientData,
    ClientResult,
    Message,
    RoundContext,
    Uplink,
    WarmStartContext,
)
from fedcomm.algorithms.prunefl.client import (
    GRAD,
    MASK,
    VERSION,
    ClientState,
    downlink,
    masks_of,
    mean_gradient,
    pack,
    train_masked,
    unpack,
    uploaded_model,
)
from fedcomm.algorithms.prunefl.readjust import is_readjust, prune_fraction, readjust
from fedcomm.algorithms.prunefl.times import entry_times, maskable, validate_model
from fedcomm.algorithms.sparse import churn
from fedcomm.algorithms.sparse import masks as _masks
from fedcomm.comm.payload import Dense, Mask, Payload
from fedcomm.server_opt import OptState, Transform
from fedcomm.types import ParamDict

masked = _masks.apply_masks  # parameters with every maskable entry outside its mask set to 0
density = _masks.density  # fraction of maskable entries that are active


class Config(AlgorithmConfig):
    name: Literal["prunefl"] = "prunefl"
    initial_rounds: int = Field(
        5, ge=0, description="phase one's local rounds at most (code default 5; README runs 1000)"
    )
    initial_readjust_every: int = Field(
        50, ge=1, description="phase one: rounds between readjustments"
    )
    readjust_every: int = Field(50, ge=1, description="federated rounds between readjustments")
    first_readjust: int = Field(
        2, ge=1, description="first readjusting round of each phase, 1-based (the code's r = 1)"
    )
    p_initial: float = Field(0.3, ge=0, le=1, description="pruned fraction p in phase one")
    p_federated: float = Field(0.3, ge=0, le=1, description="p = p_federated · p_decay^j")
    p_decay: float = Field(0.5, ge=0, le=1)
    p_exponent: Literal["readjustment", "round"] = Field(
        "readjustment", description="j: the federated readjustment's index, or round − 1 (code)"
    )
    early_stop_patience: int = Field(
        5, ge=1, description="phase one stops after this many consecutive small readjustments"
    )
    early_stop_churn: float = Field(
        0.1, gt=0, le=1, description="a readjustment is small if it changes < this of the mask"
    )
    layer_time: Literal["uniform", "flops"] | list[PositiveFloat] = Field(
        "uniform", description="per-entry time of each maskable layer (see the module docstring)"
    )
    time_offset: float = Field(0.2, ge=0, description="c: fixed time per round (the code's 0.2)")
    weighting: Literal["num_examples", "uniform"] = "num_examples"


@dataclass(frozen=True)
class ServerState:
    params: ParamDict  # zero outside the mask
    opt_state: OptState
    masks: dict[str, Tensor]  # bool, one per maskable parameter
    times: dict[str, float] | None  # per-entry time per maskable layer (flops: set by phase one)
    mask_version: int = 0  # bumped whenever the mask changes
    readjustments: int = 0  # federated readjustments so far
    churn: float | None = None  # fraction of the mask changed by this round's readjustment
    p: float | None = None  # the pruned fraction used by this round's readjustment
    phase_one_rounds: int = 0


# --- phase one: one client prunes the initial model ----------------------------------------------


def pick_client(train: Sequence[ClientData], generator: torch.Generator) -> int:
    """A client drawn uniformly from those with training data."""
    with_data = [k for k, d in enumerate(train) if d.num_examples > 0]
    if not with_data:
        raise ValueError("prunefl: no client has training data for phase one")
    pick = torch.randint(len(with_data), (1,), generator=generator, device=generator.device)
    return with_data[int(pick)]


def phase_one(
    cfg: Config,
    opt: Transform,
    state: ServerState,
    train: Sequence[ClientData],
    ctx: WarmStartContext,
) -> tuple[ServerState, list[Message]]:
    """Up to ``initial_rounds`` local rounds on one client, readjusting its mask with ``p_initial``
    and stopping early once the mask settles; its sparse model becomes the global one."""
    cid = pick_client(train, ctx.generator)
    data = train[cid]
    times = state.times or entry_times(ctx.model, cfg.layer_time, data.x[0])
    if cfg.initial_rounds == 0:
        return replace(state, times=times), []
    params, masks, churns, rounds = state.params, state.masks, [], 0
    for i in range(1, cfg.initial_rounds + 1):
        rounds = i
        params, grads, _ = train_masked(ctx.model, params, masks, data, ctx.local, ctx.generator)
        if is_readjust(i, cfg.first_readjust, cfg.initial_readjust_every):
            new = readjust(grads, times, cfg.p_initial, cfg.time_offset)
            churns.append(churn(masks, new))
            masks, params = new, masked(params, new)
        recent = churns[-cfg.early_stop_patience :]
        if len(recent) == cfg.early_stop_patience and all(c < cfg.early_stop_churn for c in recent):
            break
    version = state.mask_version + int(churn(state.masks, masks) > 0)
    entries = pack(params, masks) | {MASK + k: Mask(m) for k, m in masks.items()}
    new_state = ServerState(
        params, opt.init(params), masks, times, version, phase_one_rounds=rounds
    )
    return new_state, [(cid, "up", Payload(entries))]


# --- the client ----------------------------------------------------------------------------------


def client_update(
    cfg: Config,
    down: Mapping[str, Tensor],
    cstate: ClientState,
    data: ClientData,
    ctx: ClientContext,
) -> ClientResult:
    """Train the active weights from the global model; upload the update on the active entries
    (and the dense gradient in readjustment rounds). The client keeps the server's mask."""
    shapes = {k: p.detach() for k, p in ctx.model.named_parameters()}
    masks = masks_of(down)
    start = unpack(down, shapes, masks)
    trained, grads, loss = train_masked(ctx.model, start, masks, data, ctx.local, ctx.generator)
    entries = pack({k: trained[k] - start[k] for k in start}, masks)
    if is_readjust(ctx.round_, cfg.first_readjust, cfg.readjust_every):
        entries |= {GRAD + k: Dense(g) for k, g in grads.items()}  # 32·N_m bits
    return ClientResult(
        uplink=Payload(entries),
        state=ClientState(int(down[VERSION])),
        local_params=trained,
        num_examples=data.num_examples,
        metrics={"train/loss": loss},
    )


# --- the server ----------------------------------------------------------------------------------


def server_update(
    cfg: Config, opt: Transform, state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
) -> ServerState:
    """``w ← m ⊙ (w + server_opt(Σ_k n_k Δ_k / Σ_k n_k))``; in a readjustment round, then
    :func:`readjust_mask`."""
    deltas = [unpack(u.tensors, state.params, state.masks) for u in uplinks]
    delta = core.weighted_mean(deltas, core.client_weights(uplinks, cfg.weighting))
    params, opt_state = opt.apply(state.params, delta, state.opt_state)
    params = masked(params, state.masks)
    state = replace(state, params=params, opt_state=opt_state, churn=None, p=None)
    if not is_readjust(ctx.round_, cfg.first_readjust, cfg.readjust_every):
        return state
    return readjust_mask(cfg, state, uplinks, ctx.round_)


def readjust_mask(
    cfg: Config, state: ServerState, uplinks: Sequence[Uplink], round_: int
) -> ServerState:
    """The j-th federated readjustment: :func:`readjust` on the unweighted mean of the clients'
    gradients (as the code) with ``p`` of :func:`prune_fraction`; leaving weights are zeroed."""
    if state.times is None:
        raise ValueError("prunefl: layer times unknown (flops needs warm_start)")
    j = state.readjustments + 1
    p = prune_fraction(cfg, j, round_)
    new = readjust(mean_gradient(uplinks, state.masks), state.times, p, cfg.time_offset)
    change = churn(state.masks, new)
    return replace(
        state,
        params=masked(state.params, new),
        masks=new,
        mask_version=state.mask_version + int(change > 0),
        readjustments=j,
        churn=change,
        p=p,
    )


def server_metrics(state: ServerState) -> dict[str, float]:
    out = {
        "mask_density": density(state.masks),
        "readjustments": float(state.readjustments),
        "phase_one_rounds": float(state.phase_one_rounds),
    }
    if state.churn is not None and state.p is not None:
        out |= {"mask_churn": state.churn, "prune_fraction": state.p}
    return out


# --- the algorithm -------------------------------------------------------------------------------


def make(cfg: Config) -> FedAlgorithm[ServerState]:
    opt = cfg.server.build()

    def init_server(params: ParamDict, ctx: RoundContext) -> ServerState:
        if ctx.model is None:
            raise ValueError("prunefl needs the model structure in the round context")
        masks = {n: torch.ones_like(params[n], dtype=torch.bool) for n in maskable(ctx.model)}
        times = None if cfg.layer_time == "flops" else entry_times(ctx.model, cfg.layer_time, None)
        return ServerState(core.clone_params(params), opt.init(params), masks, times)

    def broadcast(
        state: ServerState, client_id: int, cstate: ClientState, ctx: RoundContext
    ) -> Payload:
        fresh = cstate.mask_version == state.mask_version
        return downlink(state.params, state.masks, state.mask_version, fresh)

    return FedAlgorithm(
        name=cfg.name,
        config=cfg,
        init_server=init_server,
        init_client=lambda client_id: ClientState(),
        broadcast=broadcast,
        client_update=partial(client_update, cfg),
        server_update=partial(server_update, cfg, opt),
        global_params=lambda s: s.params,
        server_metrics=server_metrics,
        uploaded_model=uploaded_model,
        validate_model=validate_model,
        warm_start=partial(phase_one, cfg, opt),
        execution=core.Execution(
            sparse_compute=True,  # masked training, as FedDST's
            unbatched=(
                "readjustment rounds upload the dense gradient of each client's last minibatch, "
                "taken inside that step at that step's weights: a side output of the step that "
                "the batched executor does not return"
            ),
        ),
    )


@core.register(Config)
def build(cfg: Config) -> FedAlgorithm[ServerState]:
    return make(cfg)
