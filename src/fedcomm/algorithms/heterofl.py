"""HeteroFL: every client trains the sub-model made of the *first* units of each hidden layer.

Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient Federated Learning
for Heterogeneous Clients", ICLR 2021; as a baseline of FedBIAD (specs/fedsparse-fedbiad.md
§2.5, output layer full as in §2.7).

Model rate ``r`` (one rate for every client, the spec's Rec): every hidden layer of
``rows(model)`` (conv filters, hidden linear units) keeps its first ``ceil(r·C)`` units; the
network's inputs and the output layer stay full. A kept unit takes its weight row and bias and
the next layer's input columns reading it (after a flatten, the ``in_features / channels``
consecutive columns of its channel), exactly FedDrop's unit graph (:mod:`.feddrop`) with a
deterministic prefix instead of a random selection.

* down: the sub-model's values (32 bits each); the slice follows from ``r`` and the model, so
  its pattern is a 0-bit ``Free`` mask. Up: the delta of local SGD on the same entries (entries
  outside the slice are 0 and their gradients masked: the smaller dense network);
* ``scaler`` (training only): each hidden layer's output is divided by ``r`` (the official
  ``Scaler`` module sits right after each hidden conv/linear, before norm and activation), done
  here by dividing that layer's weight and bias by ``r`` in the forward pass (``param_map``);
  the trained and evaluated weights are the unscaled ones, so evaluation uses no scaler;
* ``mask_labels``: during local training the logits of labels absent from the client's train
  split are set to 0 (the official ``masked_fill(label_mask == 0, 0)``), done by zeroing the
  output layer's rows of those labels in the forward pass;
* server: per entry ``Δ = Σ_k w_k δ_k / Σ_{k holds it} w_k`` with ``w_k = 1`` (``count``, the
  official unweighted count) or ``n_k`` (``num_examples``), then ``w ← w + server_opt(Δ)``
  (SGD, lr 1: the per-entry average of the returned sub-models) where some client held the
  entry; entries with count 0 stay unchanged.

Static batch normalisation is moot here: the sequential models (``mlp``, ``cnn``,
``mnist_cnn``) have no BatchNorm, so there are no running statistics to track or drop.
Sequential Linear/Conv chains only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
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
)
from fedcomm.algorithms.feddrop import (
    aggregate,
    decode_kept,
    encode_kept,
    keep_masks,
    masked_grads,
    param_masks,
    submodel_job,
    submodel_result,
    unit_layers,
    uploaded_model,
)
from fedcomm.comm.payload import Payload
from fedcomm.models.groups import GroupSpec, expand_mask
from fedcomm.server_opt import OptState, apply_step
from fedcomm.types import Params

LABELS = "labels."  # a client's label masks of the output layer in its local job
_EPS = 1e-9  # ceil(0.7·10) must be 7, not 8 (0.7·10 = 7.000000000000001 in floating point)


def width_units(rate: float, count: int) -> int:
    """``ceil(rate·count)`` units (at least one), robust to floating-point noise."""
    return min(count, max(1, math.ceil(rate * count - _EPS)))


def sequential_layers(model: nn.Module | None, algorithm: str) -> tuple[GroupSpec, ...]:
    """The unit graph of a sequential Linear/Conv chain (:func:`feddrop.unit_layers`), with an
    error naming ``algorithm`` for any other model."""
    try:
        return unit_layers(model)
    except ValueError:
        raise ValueError(
            f"{algorithm} supports the sequential models mlp, cnn and mnist_cnn (and needs the "
            f"model in the round context), not {type(model).__name__}: width slicing of "
            "residual or recurrent models is not implemented"
        ) from None


def validate_model(model: nn.Module, algorithm: str = "heterofl") -> None:
    sequential_layers(model, algorithm)  # raises ValueError


def first_units(layers: Sequence[GroupSpec], rate: float) -> dict[str, Tensor]:
    """Keep masks ``(count,)`` per layer: the first ``ceil(rate·count)`` units of every hidden
    layer, every unit of the output layer."""
    keep = {}
    for spec in layers:
        kept = spec.count if spec.is_output else width_units(rate, spec.count)
        keep[spec.name] = torch.arange(spec.count, device="cpu") < kept  # (moved to each param)
    return keep


def slice_masks(
    layers: Sequence[GroupSpec], rate: float, params: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Full-shape bool masks of the width-``rate`` sub-model (:func:`feddrop.param_masks` of
    :func:`first_units`)."""
    return param_masks(layers, first_units(layers, rate), params)


def scaler_map(layers: Sequence[GroupSpec], rate: float) -> _local.ParamMap:
    """Forward parameters with every hidden layer's weight and bias divided by ``rate``: each
    hidden layer's output (pre-activation) is divided by ``rate``, as HeteroFL's ``Scaler``."""
    names = frozenset(n for s in layers if not s.is_output for n in s.param_names)

    def forward(params: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: v / rate if k in names else v for k, v in params.items()}

    return forward


def label_masks(
    layers: Sequence[GroupSpec], labels: Tensor, params: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Bool masks of the output layer's rows (weight and bias) of the labels in ``labels``."""
    out = next(s for s in layers if s.is_output)
    present = torch.zeros(out.count, dtype=torch.bool, device=labels.device)
    present[labels.reshape(-1).long().unique()] = True
    return {k: m.bool() for k, m in expand_mask(out, present, params).items()}


def label_mask_map(
    layers: Sequence[GroupSpec], labels: Tensor, params: Mapping[str, Tensor]
) -> _local.ParamMap:
    """Forward parameters with the output layer's rows (weight and bias) of every label not in
    ``labels`` set to 0, so those logits are exactly 0 and receive no gradient."""
    masks = label_masks(layers, labels, params)

    def forward(params: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: v * masks[k] if k in masks else v for k, v in params.items()}

    return forward


class Config(AlgorithmConfig):
    """``server`` defaults to SGD with lr 1 (plain per-entry averaging, as the paper)."""

    name: Literal["heterofl"] = "heterofl"
    rate: float = Field(0.8, gt=0, le=1, description="model rate r: hidden layers keep ceil(r·C)")
    scaler: bool = Field(True, description="divide hidden outputs by r during local training")
    weighting: Literal["count", "num_examples"] = "count"  # official code: unweighted count
    mask_labels: bool = Field(False, description="zero the logits of labels a client lacks")


@dataclass(frozen=True)
class ServerState:
    params: Params
    opt_state: OptState
    layers: tuple[GroupSpec, ...]


@register(Config)
def build(cfg: Config) -> FedAlgorithm:
    opt = cfg.server.build()

    def init_server(params: Params, ctx: RoundContext) -> ServerState:
        layers = sequential_layers(ctx.model, cfg.name)
        return ServerState(clone_params(params), opt.init(params), layers)

    def broadcast(state: ServerState, client_id: int, cstate: None, ctx: RoundContext) -> Payload:
        return Payload(encode_kept(state.params, slice_masks(state.layers, cfg.rate, state.params)))

    programs: dict[int, tuple[nn.Module, _jobs.LocalProgram]] = {}

    def program_for(model: nn.Module) -> _jobs.LocalProgram:
        """Masked SGD on the slice; forward: the scaler, then the client's label masks."""
        hit = programs.get(id(model))
        if hit is not None and hit[0] is model:
            return hit[1]
        layers = sequential_layers(model, cfg.name)
        scale = scaler_map(layers, cfg.rate) if cfg.scaler and cfg.rate < 1 else None

        def param_map(full: dict[str, Tensor]) -> dict[str, Tensor]:
            out = scale(full) if scale is not None else full
            if cfg.mask_labels:
                out = {k: v * full[LABELS + k] if LABELS + k in full else v for k, v in out.items()}
            return out

        uses_map = scale is not None or cfg.mask_labels
        program = _jobs.LocalProgram(
            grad_hook=masked_grads, param_map=param_map if uses_map else None
        )
        programs[id(model)] = (model, program)
        return program

    def client_job(
        down: Mapping[str, Tensor], cstate: None, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        layers = sequential_layers(ctx.model, cfg.name)

        def labels(sub: Params) -> dict[str, Tensor]:
            if not cfg.mask_labels:
                return {}
            return {LABELS + k: m for k, m in label_masks(layers, data.y, sub).items()}

        def finish(res: _jobs.JobResult, sub: Params, keep: dict[str, Tensor]) -> ClientResult:
            return submodel_result(res.live, sub, keep, data, {"train/loss": res.loss}, "heterofl")

        return submodel_job(down, data, ctx, finish, program=program_for(ctx.model), extra=labels)

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        deltas = [decode_kept(u.tensors) for u in uplinks]
        masks = [keep_masks(u.tensors) for u in uplinks]
        weighting = "uniform" if cfg.weighting == "count" else "num_examples"
        delta, held = aggregate(deltas, masks, client_weights(uplinks, weighting), "held")
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
        validate_model=lambda model: validate_model(model, cfg.name),
    )
