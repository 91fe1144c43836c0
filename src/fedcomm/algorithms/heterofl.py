"""HeteroFL: every client trains the sub-model made of the *first* units of each hidden layer.

Diao, Ding and Tarokh, "HeteroFL: Computation and Communication Efficient Federated Learning
for Heterogeneous Clients", ICLR 2021; as a baseline of FedBIAD (Xue et al., IPDPS 2023,
Section V-A; the output layer full: its units are the classes).

Model rate ``r`` (one rate for every client: FedBIAD does not give HeteroFL's rates): every
hidden layer of ``rows(model)`` (conv filters, hidden linear units) keeps its first
``ceil(r·C)`` units; the network's inputs and the output layer stay full. A kept unit takes
its weight row and bias and the next layer's input columns reading it (after a flatten, the
``in_features / channels`` consecutive columns of its channel), exactly FedDrop's unit graph
(:mod:`.submodel.units`) with the ordered rule (a prefix) instead of a random selection.

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

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from fedcomm.algorithms import submodel
from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm, register
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.context import ClientContext, ClientData, RoundContext
from fedcomm.algorithms.submodel.merge import masked_mean
from fedcomm.algorithms.submodel.units import first_units
from fedcomm.algorithms.submodel.units import unit_layers as sequential_layers
from fedcomm.models.groups import GroupSpec, expand_mask
from fedcomm.types import ParamDict

LABELS = "labels."  # a client's label masks of the output layer in its local job


class Config(AlgorithmConfig):
    """``server`` defaults to SGD with lr 1 (plain per-entry averaging, as the paper)."""

    name: Literal["heterofl"] = "heterofl"
    rate: float = Field(0.8, gt=0, le=1, description="model rate r: hidden layers keep ceil(r·C)")
    scaler: bool = Field(True, description="divide hidden outputs by r during local training")
    weighting: Literal["count", "num_examples"] = "count"  # official code: unweighted count
    mask_labels: bool = Field(False, description="zero the logits of labels a client lacks")


def scaler_map(layers: Sequence[GroupSpec], rate: float) -> _local.ParamMap:
    """Forward parameters with every hidden layer's weight and bias divided by ``rate``: each
    hidden layer's output (pre-activation) is divided by ``rate``, as HeteroFL's ``Scaler``."""
    return submodel.hidden_scaler(layers, {s.name: rate for s in layers})


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


def local_program(cfg: Config, layers: Sequence[GroupSpec]) -> _jobs.LocalProgram:
    """Masked SGD on the slice; forward: the scaler, then the client's label masks (per client:
    they ride in the job's frozen tensors as ``labels.<param>``)."""
    scale = scaler_map(layers, cfg.rate) if cfg.scaler and cfg.rate < 1 else None

    def param_map(full: dict[str, Tensor]) -> dict[str, Tensor]:
        out = scale(full) if scale is not None else full
        if cfg.mask_labels:
            out = {k: v * full[LABELS + k] if LABELS + k in full else v for k, v in out.items()}
        return out

    uses_map = scale is not None or cfg.mask_labels
    return _jobs.LocalProgram(
        grad_hook=submodel.masked_grads, param_map=param_map if uses_map else None
    )


@register(Config)
def build(cfg: Config) -> FedAlgorithm[submodel.ServerState]:
    programs: dict[int, tuple[nn.Module, _jobs.LocalProgram]] = {}

    def program_for(model: nn.Module) -> _jobs.LocalProgram:
        """One program per model structure, shared by the clients training it."""
        hit = programs.get(id(model))
        if hit is None or hit[0] is not model:
            program = local_program(cfg, sequential_layers(model, cfg.name))
            hit = programs[id(model)] = (model, program)
        return hit[1]

    def labels(sub: ParamDict, data: ClientData, ctx: ClientContext) -> dict[str, Tensor]:
        if not cfg.mask_labels:
            return {}
        layers = sequential_layers(ctx.model, cfg.name)
        return {LABELS + k: m for k, m in label_masks(layers, data.y, sub).items()}

    def keep(state: submodel.ServerState, client_id: int, ctx: RoundContext) -> dict[str, Tensor]:
        return first_units(state.layers, cfg.rate)

    weighting = "uniform" if cfg.weighting == "count" else "num_examples"
    return submodel.algorithm(
        cfg,
        submodel.Selection(keep),
        masked_mean("held"),
        weighting=weighting,
        client_job=submodel.masked_client(cfg.name, program=program_for, extra=labels),
    )
