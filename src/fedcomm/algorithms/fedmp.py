"""FedMP with a fixed pruning ratio: magnitude-pruned sub-models and R2SP aggregation.

Jiang, Xu, Wang, Wang, Qiao, Qian, Li and Huang, "FedMP: Federated Learning through Adaptive
Model Pruning in Heterogeneous Edge Computing", IEEE ICDE 2022; as the baseline of Xue et al.,
FedBIAD (Section V-A, which runs it at FedBIAD's dropout rate ``p`` without saying how FedMP's
per-client E-UCB bandit was set): here the ratio is fixed at ``p``.

Round ``t``, client ``k``:

* the server structurally prunes the global model ``w_t``: in every hidden FC layer and conv
  layer of ``unit_layers(model)`` it removes the ``round(p·n)`` of the ``n`` units (FC
  rows, conv filters) with the smallest L1 norm (:func:`prune_units`: over the unit's weight
  row/filter and its bias, each layer scored on the unpruned ``w_t``; ties go to the lower
  index). The output layer stays full (its units are the classes). Removing a unit also
  removes the next layer's input columns reading it (:func:`.submodel.units.param_masks`).
  With a fixed ratio every client of a round gets the same sub-model;
* down: the sub-model's values (32 bits each) and its pattern: the client does not have ``w_t``
  and cannot recompute it, so the hidden layers' unit masks are sent as ``Mask`` (1 bit per
  hidden unit, counted); the full-shape parameter masks follow from them and the model
  structure (``Free``);
* the client trains the sub-model masked (pruned entries stay zero and frozen: the smaller
  dense network) and uploads the delta of the sub-model's entries (32 bits each; the server
  knows the pattern it sent, so the up pattern is ``Free``);
* server, R2SP: each returned sub-model is recovered to full size by filling the pruned
  positions with the current global values (:func:`recover`); the recovered models are averaged
  with ``|D_k|`` weights (:func:`r2sp`), i.e. ``Δ = Σ_k n_k (recovered_k − w_t) / Σ_k n_k`` —
  the client deltas with zeros at pruned positions, divided by *every* client's weight — then
  ``w ← w + server_opt(Δ)`` (SGD, lr 1: exactly the R2SP average).

Sequential Linear/Conv chains only (``mlp``, ``cnn``, ``mnist_cnn``), like FedDrop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from fedcomm.algorithms import submodel
from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm, register, weighted_mean
from fedcomm.algorithms.core.context import RoundContext
from fedcomm.algorithms.submodel.merge import recovered_mean
from fedcomm.algorithms.submodel.units import keep_counts, select
from fedcomm.comm.payload import Mask
from fedcomm.models.groups import GroupSpec
from fedcomm.server_opt import ServerOptConfig
from fedcomm.types import ParamDict


class Config(AlgorithmConfig):
    name: Literal["fedmp"] = "fedmp"
    server: ServerOptConfig = Field(default_factory=ServerOptConfig)  # sgd, lr 1: R2SP average
    p: float = Field(
        0.2, ge=0, lt=1, description="fraction of hidden FC units / conv filters pruned"
    )
    weighting: Literal["num_examples", "uniform"] = "num_examples"


def unit_l1_norms(spec: GroupSpec, params: Mapping[str, Tensor]) -> Tensor:
    """``(count,)`` L1 norm of each unit over all of its members (weight row/filter and bias)."""
    flat = [params[name].movedim(axis, 0).reshape(spec.count, -1) for name, axis in spec.members]
    return torch.cat(flat, dim=1).abs().sum(dim=1)


def prune_units(
    layers: Sequence[GroupSpec], params: Mapping[str, Tensor], p: float
) -> dict[str, Tensor]:
    """Unit keep masks: per hidden layer the ``round(p·n)`` smallest-L1 units pruned (stable:
    among equal norms the lower index goes first), the output layer full."""

    def by_l1(spec: GroupSpec, n_keep: int) -> Tensor:  # largest first, ties: higher index
        return torch.argsort(unit_l1_norms(spec, params), stable=True).flip(0)

    return select(layers, keep_counts(layers, p), by_l1)


def recover(
    global_params: Mapping[str, Tensor], sub: ParamDict, keep: Mapping[str, Tensor]
) -> ParamDict:
    """R2SP recovery: the sub-model's values where kept, the global values at pruned positions."""
    return {k: torch.where(keep[k], sub[k], g) for k, g in global_params.items()}


def r2sp(
    global_params: Mapping[str, Tensor],
    subs: Sequence[ParamDict],
    keeps: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
) -> ParamDict:
    """The R2SP aggregate: the weighted mean of the recovered sub-models (the server computes
    it as ``w`` plus the mean delta: :func:`.submodel.merge.recovered_mean`)."""
    recovered = [recover(global_params, s, k) for s, k in zip(subs, keeps, strict=True)]
    return weighted_mean(recovered, weights)


@register(Config)
def build(cfg: Config) -> FedAlgorithm[submodel.ServerState]:
    def keep(state: submodel.ServerState, client_id: int, ctx: RoundContext) -> dict[str, Tensor]:
        return prune_units(state.layers, state.params, cfg.p)  # the same for every client

    return submodel.algorithm(
        cfg,
        submodel.Selection(keep),
        recovered_mean,
        weighting=cfg.weighting,
        pattern=Mask,  # the client cannot recompute w_t's ranking: 1 bit per hidden unit
    )
