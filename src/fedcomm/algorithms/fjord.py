"""FjORD: ordered dropout, per-batch widths up to the client's ``q_max``, nested aggregation.

Horváth, Laskaridis, Almeida, Leontiadis, Venieris and Lane, "FjORD: Fair and Accurate
Federated Learning under Heterogeneous Targets with Ordered Dropout", NeurIPS 2021; as a
baseline of FedBIAD (specs/fedsparse-fedbiad.md §2.5, output layer full as in §2.7).

The width-``q`` sub-model keeps the first ``ceil(q·K_l)`` units of every hidden layer (inputs
and the output layer full), the nested slices of :func:`heterofl.slice_masks`.

* down: the ``q_max`` slice of the global model (32 bits per value; the slice follows from
  ``q_max``: 0-bit ``Free`` pattern); up: the delta of local training on the same entries;
* local training: for every local batch a width ``q ~ Uniform{levels ≤ q_max}`` is drawn from
  the client's generator (after its batch schedule, so it is replayable) and SGD trains the
  ``q`` sub-model on that batch: the forward pass sees the parameters masked to the ``q``
  slice, so entries outside it get zero gradient (momentum and weight decay, if configured, act
  on the whole ``q_max`` sub-model, as a full-parameter optimizer does);
* server, nested aggregation: for each level ``q`` (ascending), the block of entries inside the
  ``q`` slice and outside the previous level's slice is averaged, weighted by ``n_k``, over the
  clients whose upload covers the ``q`` slice (``q_max ≥ q``); entries of no covered block keep
  their values. Then ``w ← w + server_opt(Δ)`` (SGD, lr 1) on the covered entries. With every
  client at the same ``q_max`` this is the ``n_k``-weighted mean of the ``q_max`` slice.

Not implemented: self-distillation from the ``q_max`` sub-model (optional in the paper).
Sequential Linear/Conv chains only (``mlp``, ``cnn``, ``mnist_cnn``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import Field, field_validator, model_validator
from torch import Tensor

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
from fedcomm.algorithms.feddrop import (
    decode_kept,
    encode_kept,
    keep_masks,
    submodel_result,
    uploaded_model,
)
from fedcomm.algorithms.heterofl import sequential_layers, slice_masks, validate_model
from fedcomm.comm.payload import Payload
from fedcomm.models.groups import GroupSpec
from fedcomm.server_opt import OptState, apply_step
from fedcomm.types import Params

Level = Annotated[float, Field(gt=0, le=1)]


class Config(AlgorithmConfig):
    """``server`` defaults to SGD with lr 1 (plain nested averaging, as the paper)."""

    name: Literal["fjord"] = "fjord"
    q_max: float = Field(0.8, gt=0, le=1, description="client width: one of `levels`")
    levels: list[Level] = Field(
        default_factory=lambda: [0.2, 0.4, 0.6, 0.8, 1.0], description="the width levels P"
    )

    @field_validator("levels")
    @classmethod
    def _sorted_unique(cls, levels: list[float]) -> list[float]:
        if not levels:
            raise ValueError("levels must not be empty")
        return sorted(set(levels))

    @model_validator(mode="after")
    def _q_max_is_a_level(self) -> Config:
        if self.q_max not in self.levels:
            raise ValueError(f"q_max={self.q_max} must be one of levels={self.levels}")
        return self


@dataclass(frozen=True)
class ServerState:
    params: Params
    opt_state: OptState
    layers: tuple[GroupSpec, ...]


def allowed_levels(levels: Sequence[float], q_max: float) -> list[float]:
    """The widths a client with ``q_max`` trains: ``{q ∈ levels : q ≤ q_max}``, ascending."""
    return sorted(q for q in levels if q <= q_max)


def sample_widths(
    levels: Sequence[float], q_max: float, num_batches: int, generator: torch.Generator
) -> list[float]:
    """One width per local batch, uniform over :func:`allowed_levels`."""
    allowed = allowed_levels(levels, q_max)
    idx = torch.randint(len(allowed), (num_batches,), generator=generator, device=generator.device)
    return [allowed[int(i)] for i in idx]


def nested_aggregate(
    deltas: Sequence[Mapping[str, Tensor]],
    masks: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    level_masks: Sequence[Mapping[str, Tensor]],
) -> tuple[Params, dict[str, Tensor]]:
    """``(Δ, covered)``: on the block of level ``i`` (``level_masks[i] & ~level_masks[i-1]``,
    levels ascending and nested), ``Δ`` is the ``weights``-weighted mean of the deltas of the
    clients whose mask covers all of ``level_masks[i]``; 0 and not covered where no client does.
    """
    out = {k: torch.zeros_like(v) for k, v in deltas[0].items()}
    covered = {k: torch.zeros_like(v, dtype=torch.bool) for k, v in deltas[0].items()}
    prev: Mapping[str, Tensor] = {k: torch.zeros_like(v) for k, v in covered.items()}
    for level in level_masks:
        holders = [
            i for i, m in enumerate(masks) if all(bool((m[k] | ~level[k]).all()) for k in level)
        ]
        if holders:
            mean = weighted_mean([deltas[i] for i in holders], [weights[i] for i in holders])
            for k in out:
                block = level[k] & ~prev[k]
                out[k] = torch.where(block, mean[k], out[k])
                covered[k] = covered[k] | block
        prev = level
    return out, covered


WIDTH = "width."  # the step's width-q slice masks in a client's local job (one per step)


def _width_masked(full: dict[str, Tensor]) -> dict[str, Tensor]:
    """Forward parameters masked to the step's width-``q`` slice (all ones at full width)."""
    return {k: v * full[WIDTH + k] if WIDTH + k in full else v for k, v in full.items()}


PROGRAM = _jobs.LocalProgram(param_map=_width_masked)


@register(Config)
def build(cfg: Config) -> FedAlgorithm:
    opt = cfg.server.build()

    def init_server(params: Params, ctx: RoundContext) -> ServerState:
        layers = sequential_layers(ctx.model, cfg.name)
        return ServerState(clone_params(params), opt.init(params), layers)

    def broadcast(state: ServerState, client_id: int, cstate: None, ctx: RoundContext) -> Payload:
        return Payload(
            encode_kept(state.params, slice_masks(state.layers, cfg.q_max, state.params))
        )

    def client_job(
        down: Mapping[str, Tensor], cstate: None, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        sub = decode_kept(down)
        keep = keep_masks(down)
        layers = sequential_layers(ctx.model, cfg.name)
        masks = {
            q: {WIDTH + k: m.to(sub[k].dtype) for k, m in slice_masks(layers, q, sub).items()}
            for q in allowed_levels(cfg.levels, cfg.q_max)
        }
        batches = _local.batch_schedule(data.num_examples, ctx.local, ctx.generator)
        widths = sample_widths(cfg.levels, cfg.q_max, len(batches), ctx.generator)
        upcoming = iter(widths)

        def draws() -> dict[str, Tensor]:  # the step's width (drawn up front, in step order)
            return masks[next(upcoming)]

        def finish(res: _jobs.JobResult) -> ClientResult:
            params = {k: res.live[k] for k in sub}
            mean_width = sum(widths) / len(widths) if widths else float("nan")
            metrics = {"train/loss": res.loss, "fjord/mean_width": mean_width}
            return submodel_result(params, sub, keep, data, metrics, "fjord")

        return _jobs.new_job(PROGRAM, sub, data, ctx.local, batches, finish, draws=draws)

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        deltas = [decode_kept(u.tensors) for u in uplinks]
        masks = [keep_masks(u.tensors) for u in uplinks]
        levels = [slice_masks(state.layers, q, state.params) for q in cfg.levels]
        weights = client_weights(uplinks, "num_examples")
        delta, covered = nested_aggregate(deltas, masks, weights, levels)
        step, opt_state = opt.update(delta, state.opt_state)
        step = {k: torch.where(covered[k], s, 0.0) for k, s in step.items()}
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
