"""FedDrop: each client trains a random sub-model with whole units dropped.

Caldas, Konečný, McMahan and Talwalkar, "Expanding the Reach of Federated Learning by Reducing
Client Resource Requirements", arXiv:1812.07210, 2018; as the baseline of Louizos et al., "An
Expectation-Maximization Perspective on Federated Learning", Appendix A (spec §1.6).

Round ``t``, client ``k`` (selection from ``(seed, ALGORITHM, t, k)``, replayed by both sides:
0 bits): drop exactly ``round(p·n)`` of the ``n`` units of every layer of ``rows(model)``, with
``p = conv_rate`` for conv filters and ``fc_rate`` for hidden linear units (the output layer only
with ``drop_output``; its dropped logits are then fixed at 0, not removed). A dropped unit takes
its weight row and bias and the next layer's input columns reading it (after a flatten, the
``in_features / channels`` consecutive columns of its channel).

* down: the sub-model's values, 32 bits each; up: the delta of masked local SGD on the same
  entries (dropped entries stay 0 and their gradients are masked: the smaller dense network,
  no rescaling);
* server: per entry ``Δ = Σ_k n_k δ_k / Σ_{k holds it} n_k`` (``aggregate="all"``: divided by
  every client's weight), then ``w ← w + server_opt(Δ)`` (Adam, lr 1e-3) where some client held
  the entry; entries nobody held stay untouched.

Sequential Linear/Conv chains only (``mlp``, ``cnn``, ``mnist_cnn``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from fedcomm.algorithms import _jobs, _local
from fedcomm.algorithms.base import (
    AlgorithmConfig,
    ClientContext,
    ClientData,
    ClientResult,
    FedAlgorithm,
    RoundContext,
    Uplink,
    client_weights,
    clone_params,
    register,
    weighted_mean,
)
from fedcomm.comm.payload import Dense, Entry, Free, Payload
from fedcomm.models.groups import GroupSpec, expand_mask, rows
from fedcomm.models.vision import MLP, ConvNet
from fedcomm.seeding import Stream, torch_generator
from fedcomm.server_opt import OptState, ServerOptConfig, apply_step
from fedcomm.types import Params

KEEP = "keep/"  # f"keep/{param}": the Free keep mask next to a parameter's kept values


def encode_kept(tensors: Mapping[str, Tensor], keep: Mapping[str, Tensor]) -> dict[str, Entry]:
    """Each tensor's kept values (32 bits each) plus its full-shape bool keep mask as ``Free``
    (replayed by the receiver from the shared seed)."""
    out: dict[str, Entry] = {k: Dense(t.detach()[keep[k]]) for k, t in tensors.items()}  # 32·kept
    return out | {KEEP + k: Free(keep[k]) for k in tensors}  # 0 bits


def keep_masks(decoded: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The keep masks of a decoded :func:`encode_kept` message, by parameter."""
    return {k.removeprefix(KEEP): v for k, v in decoded.items() if k.startswith(KEEP)}


def decode_kept(decoded: Mapping[str, Tensor]) -> Params:
    """Inverse of :func:`encode_kept`: full tensors, zeros off the keep masks."""
    out: Params = {}
    for name, keep in keep_masks(decoded).items():
        out[name] = decoded[name].new_zeros(keep.shape)
        out[name][keep] = decoded[name]
    return out


KEPT = "kept."  # a client's full-shape keep masks in its local job


def masked_grads(full: Mapping[str, Tensor], grads: dict[str, Tensor]) -> dict[str, Tensor]:
    """``g ⊙ keep``: the gradient of a client's sub-model (its keep masks from ``full``)."""
    return {k: g * full[KEPT + k] for k, g in grads.items()}


SUBMODEL = _jobs.LocalProgram(grad_hook=masked_grads)  # masked SGD: dropped entries stay 0


def submodel_job(
    down: Mapping[str, Tensor],
    data: ClientData,
    ctx: ClientContext,
    finish: Callable[[_jobs.JobResult, Params, dict[str, Tensor]], ClientResult],
    *,
    program: _jobs.LocalProgram = SUBMODEL,
    extra: Callable[[Params], dict[str, Tensor]] | None = None,
) -> _jobs.LocalJob:
    """Masked local SGD on a decoded :func:`encode_kept` downlink, as a job: gradients of the
    dropped entries are masked (per client: its keep masks ride in ``frozen``), so they stay
    zero. ``finish(result, sub-model it started from, keep masks)`` makes the client result;
    ``program`` must mask gradients with :func:`masked_grads`; ``extra(sub)`` adds per-client
    tensors its hooks read."""
    sub = decode_kept(down)
    keep = keep_masks(down)
    batches = _local.batch_schedule(data.num_examples, ctx.local, ctx.generator)
    frozen = {KEPT + k: m for k, m in keep.items()}
    if extra is not None:
        frozen.update(extra(sub))
    return _jobs.new_job(
        program, sub, data, ctx.local, batches, lambda res: finish(res, sub, keep), frozen=frozen
    )


def submodel_result(
    trained: Mapping[str, Tensor],
    sub: Mapping[str, Tensor],
    keep: Mapping[str, Tensor],
    data: ClientData,
    metrics: Mapping[str, float],
    prefix: str,
) -> ClientResult:
    """A sub-model client's result: the update on the kept entries up (32 bits each, the keep
    masks free), the trained sub-model as its local model, ``<prefix>/submodel_fraction``."""
    held = sum(int(m.sum()) for m in keep.values()) / sum(m.numel() for m in keep.values())
    return ClientResult(
        uplink=Payload(encode_kept({k: trained[k] - sub[k] for k in sub}, keep)),
        state=None,
        local_params=dict(trained),
        num_examples=data.num_examples,
        metrics={**metrics, f"{prefix}/submodel_fraction": held},
    )


def unit_layers(model: nn.Module | None) -> tuple[GroupSpec, ...]:
    """``rows(model)`` if ``model`` is a sequential Linear/Conv chain, else ValueError."""
    specs = tuple(rows(model)) if isinstance(model, MLP | ConvNet) else ()
    params = dict(model.named_parameters()) if model is not None else {}
    pairs = itertools.pairwise(specs)
    if not specs or any(params[b.members[0][0]].shape[1] % a.count for a, b in pairs):
        raise ValueError(
            "feddrop supports the sequential models mlp, cnn and mnist_cnn (and needs the model "
            f"in the round context), not {type(model).__name__}: FedDrop for residual or "
            "recurrent models is not implemented"
        )
    return specs


def validate_model(model: nn.Module) -> None:
    unit_layers(model)  # raises ValueError


def drop_counts(
    layers: Sequence[GroupSpec], conv_rate: float, fc_rate: float, drop_output: bool
) -> dict[str, int]:
    """Units dropped per layer: ``floor(rate·count + 1/2)``, keeping at least one unit.

    Every conv layer's filters and every hidden FC layer's units are dropped (Caldas et al.
    2018); the network's input features are never dropped, the output layer only with
    ``drop_output``."""
    counts = {}
    for s in layers:
        rate = conv_rate if s.kind == "filter" else fc_rate
        rate = 0.0 if s.is_output and not drop_output else rate
        counts[s.name] = min(math.floor(rate * s.count + 0.5), s.count - 1)
    return counts


def select_units(
    layers: Sequence[GroupSpec], counts: Mapping[str, int], seed: int, round_: int, client_id: int
) -> dict[str, Tensor]:
    """Keep masks ``(count,)`` per layer from ``(seed, ALGORITHM, round_, client_id)``."""
    g = torch_generator(seed, Stream.ALGORITHM, round_, client_id)
    keep = {}
    for spec in layers:
        mask = torch.ones(spec.count, dtype=torch.bool, device=g.device)  # drawn on g's device
        mask[torch.randperm(spec.count, generator=g, device=g.device)[: counts[spec.name]]] = False
        keep[spec.name] = mask
    return keep


def param_masks(
    layers: Sequence[GroupSpec], keep: Mapping[str, Tensor], params: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Full-shape bool masks of the sub-model: kept rows of each layer and, in the next layer,
    the input columns reading them."""
    masks = {n: torch.ones_like(t, dtype=torch.bool) for n, t in params.items()}
    for i, spec in enumerate(layers):
        for name, m in expand_mask(spec, keep[spec.name], params).items():
            masks[name] = masks[name] & m.bool()
        if i + 1 < len(layers):  # the next layer's weight, axis 1: `reads` columns per unit
            nxt = layers[i + 1].members[0][0]
            reads = params[nxt].shape[1] // spec.count
            shape = [1, -1] + [1] * (params[nxt].dim() - 2)
            masks[nxt] = masks[nxt] & keep[spec.name].to(masks[nxt].device).repeat_interleave(
                reads
            ).view(shape)
    return masks


class Config(AlgorithmConfig):
    name: Literal["feddrop"] = "feddrop"
    server: ServerOptConfig = Field(
        default_factory=lambda: ServerOptConfig(optimizer="adam", lr=1e-3)
    )
    conv_rate: float = Field(0.1, ge=0, lt=1, description="fraction of conv filters dropped")
    fc_rate: float = Field(0.5, ge=0, lt=1, description="fraction of hidden FC units dropped")
    drop_output: bool = False
    aggregate: Literal["held", "all"] = "held"
    weighting: Literal["uniform", "num_examples"] = "uniform"  # the paper: plain mean


@dataclass(frozen=True)
class ServerState:
    params: Params
    opt_state: OptState
    layers: tuple[GroupSpec, ...]


def aggregate(
    deltas: Sequence[Mapping[str, Tensor]],
    masks: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    how: str,
) -> tuple[Params, dict[str, Tensor]]:
    """``(Δ, held by any client)``: ``Δ = Σ w_k δ_k / Σ w_k`` over the holders (``held``) or all
    clients (``all``); where every client holds an entry both are the plain weighted mean."""
    mean = weighted_mean(deltas, weights)  # Σ_k w_k δ_k / Σ_k w_k, 0 where nobody holds
    share = torch.tensor(weights, device=deltas[0][next(iter(deltas[0]))].device) / sum(weights)
    out, held = {}, {}
    for k, m in mean.items():
        stacked = torch.stack([mk[k] for mk in masks])  # (K, *shape) bool
        held[k] = stacked.any(0)
        frac = (stacked * share.view(-1, *[1] * m.dim())).sum(0).clamp_min(1e-12)
        out[k] = m if how == "all" else torch.where(stacked.all(0), m, m / frac)
    return out, held


def uploaded_model(down: Mapping[str, Tensor], up: Mapping[str, Tensor]) -> Params:
    """The sub-model a client uploaded: its download plus its delta (zeros off the sub-model)."""
    delta = decode_kept(up)
    return {k: w + delta[k] for k, w in decode_kept(down).items()}


@register(Config)
def build(cfg: Config) -> FedAlgorithm:
    opt = cfg.server.build()

    def init_server(params: Params, ctx: RoundContext) -> ServerState:
        return ServerState(clone_params(params), opt.init(params), unit_layers(ctx.model))

    def broadcast(state: ServerState, client_id: int, cstate: None, ctx: RoundContext) -> Payload:
        counts = drop_counts(state.layers, cfg.conv_rate, cfg.fc_rate, cfg.drop_output)
        keep = select_units(state.layers, counts, ctx.seed, ctx.round_, client_id)
        return Payload(encode_kept(state.params, param_masks(state.layers, keep, state.params)))

    def client_job(
        down: Mapping[str, Tensor], cstate: None, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        def finish(res: _jobs.JobResult, sub: Params, keep: dict[str, Tensor]) -> ClientResult:
            return submodel_result(res.live, sub, keep, data, {"train/loss": res.loss}, "feddrop")

        return submodel_job(down, data, ctx, finish)

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        deltas = [decode_kept(u.tensors) for u in uplinks]
        masks = [keep_masks(u.tensors) for u in uplinks]
        weights = client_weights(uplinks, cfg.weighting)
        delta, held = aggregate(deltas, masks, weights, cfg.aggregate)
        step, opt_state = opt.update(delta, state.opt_state)
        step = {k: torch.where(held[k], s, 0.0) for k, s in step.items()}
        return ServerState(apply_step(state.params, step), opt_state, state.layers)

    return FedAlgorithm(
        name=cfg.name,
        config=cfg,
        init_server=init_server,
        init_client=lambda client_id: None,
        broadcast=broadcast,
        client_update=_jobs.job_client_update(client_job),
        client_job=client_job,
        server_update=server_update,
        global_params=lambda s: s.params,
        uploaded_model=uploaded_model,
        validate_model=validate_model,
    )
