"""The sub-model dropout family (FedDrop, AFD, FedMP, HeteroFL, FjORD) as one composition.

Each method of the family is, as an optax optimizer is a ``chain`` of transforms, one call of
:func:`algorithm` composing three pieces:

1. a **selection** (:class:`Selection`): the unit keep masks of client ``k``'s sub-model in a
   round, from a ranking rule and keep counts (:mod:`.units`); a rule with state of its
   own (AFD's score map) extends the server state and moves it after each server step;
2. the **codec** (:mod:`.codec`): the sub-model's values at 32 bits each down and its
   delta up, the full-shape pattern ``Free`` and, with ``pattern``, the unit masks as ``Free`` or
   ``Mask`` (1 bit per hidden unit, counted);
3. an **aggregation** (:mod:`.merge`): the deltas to ``(Δ, held)``, then
   ``w ← w + server_opt(Δ)`` only where some client held the entry; entries nobody held stay.

The client side is shared (:func:`masked_client`): masked local SGD on the decoded sub-model
(dropped entries are zero and their gradients masked: the smaller dense network, no rescaling),
the delta of the kept entries up, ``<prefix>/submodel_fraction`` in the metrics.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from torch import Tensor, nn

from fedcomm.algorithms import core
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.context import (
    ClientContext,
    ClientData,
    ClientResult,
    RoundContext,
    Uplink,
)
from fedcomm.algorithms.submodel.codec import (
    Pattern,
    decode_kept,
    encode,
    encode_kept,
    keep_masks,
    uploaded_model,
)
from fedcomm.algorithms.submodel.merge import Aggregation
from fedcomm.algorithms.submodel.units import unit_layers
from fedcomm.comm.payload import Entry, Payload
from fedcomm.models.groups import GroupSpec
from fedcomm.server_opt import OptState
from fedcomm.types import ParamDict


@dataclass(frozen=True)
class ServerState:
    """The family's server state; a selection with state of its own subclasses it."""

    params: ParamDict
    opt_state: OptState
    layers: tuple[GroupSpec, ...]  # the unit graph (:func:`.units.unit_layers`)


# (server state, client id, ctx) -> (count,) bool unit keep masks per layer
Keep = Callable[[Any, int, RoundContext], dict[str, Tensor]]


@dataclass(frozen=True)
class Selection:
    """Which units client ``k``'s sub-model keeps this round: ``keep(state, k, ctx)``.

    ``init(state, ctx)`` extends a fresh :class:`ServerState` with the rule's own state;
    ``update(state, uplinks, weights, ctx)`` moves it after the server step (AFD's score map)."""

    keep: Keep
    init: Callable[[ServerState, RoundContext], Any] | None = None
    update: Callable[[Any, Sequence[Uplink], list[float], RoundContext], Any] | None = None


# --- the client side --------------------------------------------------------------------------

KEPT = "kept."  # a client's full-shape keep masks in its local job


def masked_grads(full: Mapping[str, Tensor], grads: dict[str, Tensor]) -> dict[str, Tensor]:
    """``g ⊙ keep``: the gradient of a client's sub-model (its keep masks from ``full``)."""
    return {k: g * full[KEPT + k] for k, g in grads.items()}


SUBMODEL = _jobs.LocalProgram(grad_hook=masked_grads)  # masked SGD: dropped entries stay 0


def hidden_scaler(layers: Sequence[GroupSpec], keep: Mapping[str, float]) -> _local.ParamMap:
    """Forward parameters with each hidden layer's weight and bias divided by its kept share
    ``keep[layer]``: the layer's pre-activation, so (ReLU and max-pooling being positively
    homogeneous) its kept units' outputs, are scaled by ``1 / keep`` during local training, as
    inverted dropout and HeteroFL's ``Scaler`` do. The output layer is never scaled."""
    factor = {n: 1.0 / keep[s.name] for s in layers if not s.is_output for n in s.param_names}
    factor = {n: f for n, f in factor.items() if f != 1.0}

    def forward(params: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: v * factor[k] if k in factor else v for k, v in params.items()}

    return forward


def submodel_job(
    down: Mapping[str, Tensor],
    data: ClientData,
    ctx: ClientContext,
    finish: Callable[[_jobs.JobResult, ParamDict, dict[str, Tensor]], ClientResult],
    *,
    program: _jobs.LocalProgram = SUBMODEL,
    extra: Callable[[ParamDict], dict[str, Tensor]] | None = None,
) -> _jobs.LocalJob:
    """Masked local SGD on a decoded sub-model message, as a job: gradients of the dropped
    entries are masked (per client: its keep masks ride in ``frozen``), so they stay zero.
    ``finish(result, sub-model it started from, keep masks)`` makes the client result;
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
    meta: Mapping[str, Entry] | None = None,
) -> ClientResult:
    """A sub-model client's result: the update on the kept entries up (32 bits each, the keep
    masks free) with ``meta`` after it, the trained sub-model as its local model,
    ``<prefix>/submodel_fraction``."""
    held = sum(int(m.sum()) for m in keep.values()) / sum(m.numel() for m in keep.values())
    up = encode_kept({k: trained[k] - sub[k] for k in sub}, keep)
    return ClientResult(
        uplink=Payload(up | dict(meta or {})),
        state=None,
        local_params=dict(trained),
        num_examples=data.num_examples,
        metrics={**metrics, f"{prefix}/submodel_fraction": held},
    )


def masked_client(
    prefix: str,
    *,
    program: Callable[[nn.Module], _jobs.LocalProgram] | None = None,
    extra: Callable[[ParamDict, ClientData, ClientContext], dict[str, Tensor]] | None = None,
    meta: Callable[[_jobs.JobResult], dict[str, Entry]] | None = None,
    local_map: Callable[[nn.Module], _local.ParamMap | None] | None = None,
) -> _jobs.ClientJob:
    """The family's ``client_job``: :func:`submodel_job` then :func:`submodel_result`.

    ``program(model)`` replaces :data:`SUBMODEL` (HeteroFL's scaler and label masks),
    ``extra(sub, data, ctx)`` adds per-client tensors its hooks read, ``meta(result)`` entries
    to the uplink (AFD's loss), ``local_map(model)`` maps the trained sub-model to the function
    it trained as, for local evaluation (FedDrop's inverted-dropout scaling)."""

    def client_job(
        down: Mapping[str, Tensor], cstate: None, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        as_trained = local_map(ctx.model) if local_map is not None else None

        def finish(res: _jobs.JobResult, sub: ParamDict, keep: dict[str, Tensor]) -> ClientResult:
            up = meta(res) if meta is not None else None
            metrics = {"train/loss": res.loss}
            result = submodel_result(res.live, sub, keep, data, metrics, prefix, up)
            if as_trained is None:
                return result
            return replace(result, local_params=as_trained(dict(result.local_params)))

        job_program = program(ctx.model) if program is not None else SUBMODEL
        per_client = (lambda sub: extra(sub, data, ctx)) if extra is not None else None
        return submodel_job(down, data, ctx, finish, program=job_program, extra=per_client)

    return client_job


# --- the composition --------------------------------------------------------------------------


def algorithm(
    cfg: core.AlgorithmConfig,
    select: Selection,
    aggregation: Aggregation,
    *,
    weighting: str,
    pattern: Pattern = None,
    client_job: _jobs.ClientJob | None = None,
    **optional: Any,
) -> core.FedAlgorithm[Any]:  # ServerState, or the selection's subclass of it
    """A sub-model method: ``select`` → :func:`.codec.encode` (with ``pattern``) →
    ``client_job`` (default: :func:`masked_client` with prefix ``cfg.name``) → ``aggregation``
    with ``weighting`` (:func:`core.client_weights`) → ``server_opt`` where held → the
    selection's update. ``optional`` sets other :class:`core.FedAlgorithm` fields."""
    opt = cfg.server.build()

    def init_server(params: ParamDict, ctx: RoundContext) -> Any:
        layers = unit_layers(ctx.model, cfg.name)
        state = ServerState(core.clone_params(params), opt.init(params), layers)
        return state if select.init is None else select.init(state, ctx)

    def broadcast(state: Any, client_id: int, cstate: None, ctx: RoundContext) -> Payload:
        keep = select.keep(state, client_id, ctx)
        return Payload(encode(state.params, state.layers, keep, pattern))

    def server_update(state: Any, uplinks: Sequence[Uplink], ctx: RoundContext) -> Any:
        deltas = [decode_kept(u.tensors) for u in uplinks]
        masks = [keep_masks(u.tensors) for u in uplinks]
        weights = core.client_weights(uplinks, weighting)
        delta, held = aggregation(deltas, masks, weights, state)
        params, opt_state = opt.apply(state.params, delta, state.opt_state, held)
        new = replace(state, params=params, opt_state=opt_state)
        return new if select.update is None else select.update(new, uplinks, weights, ctx)

    def validate_model(model: nn.Module) -> None:
        unit_layers(model, cfg.name)  # raises ValueError

    return core.job_algorithm(
        cfg,
        init_server=init_server,
        broadcast=broadcast,
        client_job=client_job or masked_client(cfg.name),
        server_update=server_update,
        sparse_compute=True,  # a sub-model: its dropped units are not computed
        **{"uploaded_model": uploaded_model, "validate_model": validate_model, **optional},
    )
