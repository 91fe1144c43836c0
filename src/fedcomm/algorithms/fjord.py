"""FjORD: ordered dropout, per-batch widths up to the client's ``q_max``, nested aggregation.

Horváth, Laskaridis, Almeida, Leontiadis, Venieris and Lane, "FjORD: Fair and Accurate
Federated Learning under Heterogeneous Targets with Ordered Dropout", NeurIPS 2021; as a
baseline of FedBIAD (Xue et al., IPDPS 2023, Section V-A; the output layer full: its units are
the classes).

The width-``q`` sub-model keeps the first ``ceil(q·K_l)`` units of every hidden layer (inputs
and the output layer full), the nested slices of HeteroFL's ordered rule
(:func:`.submodel.units.slice_masks`).

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
from typing import Annotated, Literal

import torch
from pydantic import Field, field_validator, model_validator
from torch import Tensor

from fedcomm.algorithms import submodel
from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm, register
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.context import ClientContext, ClientData, ClientResult, RoundContext
from fedcomm.algorithms.submodel.codec import decode_kept, keep_masks
from fedcomm.algorithms.submodel.merge import nested
from fedcomm.algorithms.submodel.units import first_units, slice_masks, unit_layers
from fedcomm.models.groups import GroupSpec

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


WIDTH = "width."  # the step's width-q slice masks in a client's local job (one per step)


def width_masks(
    layers: Sequence[GroupSpec], q: float, sub: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """The width-``q`` slice masks of a step, in the parameters' dtype (``width.<param>``)."""
    return {WIDTH + k: m.to(sub[k].dtype) for k, m in slice_masks(layers, q, sub).items()}


def _width_masked(full: dict[str, Tensor]) -> dict[str, Tensor]:
    """Forward parameters masked to the step's width-``q`` slice (all ones at full width)."""
    return {k: v * full[WIDTH + k] if WIDTH + k in full else v for k, v in full.items()}


PROGRAM = _jobs.LocalProgram(param_map=_width_masked)


@register(Config)
def build(cfg: Config) -> FedAlgorithm[submodel.ServerState]:
    def client_job(
        down: Mapping[str, Tensor], cstate: None, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        """Ordered dropout: each local batch trains the sub-model of a width drawn after the
        batch schedule from the client's generator."""
        sub, keep = decode_kept(down), keep_masks(down)
        layers = unit_layers(ctx.model, cfg.name)
        masks = {q: width_masks(layers, q, sub) for q in allowed_levels(cfg.levels, cfg.q_max)}
        batches = _local.batch_schedule(data.num_examples, ctx.local, ctx.generator)
        widths = sample_widths(cfg.levels, cfg.q_max, len(batches), ctx.generator)
        upcoming = iter(widths)

        def finish(res: _jobs.JobResult) -> ClientResult:
            params = {k: res.live[k] for k in sub}
            mean_width = sum(widths) / len(widths) if widths else float("nan")
            metrics = {"train/loss": res.loss, "fjord/mean_width": mean_width}
            return submodel.submodel_result(params, sub, keep, data, metrics, cfg.name)

        def draws() -> dict[str, Tensor]:  # the step's width (drawn up front, in step order)
            return masks[next(upcoming)]

        return _jobs.new_job(PROGRAM, sub, data, ctx.local, batches, finish, draws=draws)

    def keep(state: submodel.ServerState, client_id: int, ctx: RoundContext) -> dict[str, Tensor]:
        return first_units(state.layers, cfg.q_max)

    return submodel.algorithm(
        cfg,
        submodel.Selection(keep),
        nested(cfg.levels),
        weighting="num_examples",
        client_job=client_job,
    )
