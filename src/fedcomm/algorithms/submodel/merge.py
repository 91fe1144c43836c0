"""The sub-model family's aggregations: the clients' deltas to one server direction.

An :data:`Aggregation` maps the decoded client deltas (zeros off each client's sub-model), their
full-shape keep masks and the clients' weights to ``(Δ, held)``; the family then applies
``w ← w + server_opt(Δ)`` only where ``held`` (:func:`fedcomm.algorithms.submodel.algorithm`):

* :func:`masked_mean` ``held`` (FedDrop, AFD, HeteroFL): ``Δ = Σ_k w_k δ_k / Σ_{k holds it} w_k``
  per entry; ``all`` (FedDrop's option): divided by every client's weight;
* :func:`recovered_mean` (FedMP's R2SP): the mean of the sub-models recovered to full size with
  the global values, ``Σ_k w_k (recovered_k − w) / Σ_k w_k``; every entry is held;
* :func:`nested` (FjORD): per width level, the block new at that level averaged over the
  clients whose sub-model covers the level's slice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal, Protocol

import torch
from torch import Tensor

from fedcomm.algorithms.core import weighted_mean
from fedcomm.algorithms.submodel.units import slice_masks
from fedcomm.models.groups import GroupSpec
from fedcomm.types import ParamDict


class Model(Protocol):
    """What an aggregation may read of the server state: the global model and its unit graph."""

    @property
    def params(self) -> ParamDict: ...

    @property
    def layers(self) -> tuple[GroupSpec, ...]: ...


# (client deltas, their full-shape keep masks, client weights, server state) -> (Δ, held)
Aggregation = Callable[
    [Sequence[ParamDict], Sequence[Mapping[str, Tensor]], Sequence[float], Model],
    tuple[ParamDict, dict[str, Tensor]],
]


def aggregate(
    deltas: Sequence[Mapping[str, Tensor]],
    masks: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    how: str,
) -> tuple[ParamDict, dict[str, Tensor]]:
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


def masked_mean(how: Literal["held", "all"]) -> Aggregation:
    """:func:`aggregate` over the holders of each entry (``held``) or over all clients."""
    return lambda deltas, masks, weights, state: aggregate(deltas, masks, weights, how)


def recovered_mean(
    deltas: Sequence[ParamDict],
    masks: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    state: Model,
) -> tuple[ParamDict, dict[str, Tensor]]:
    """R2SP: ``recovered_k − w`` is client ``k``'s delta with zeros at its pruned positions, so
    the mean of the recovered models is ``w`` plus the weighted mean of the deltas (computed
    without the round trip through ``w``); every recovered model holds every entry."""
    delta = weighted_mean(deltas, weights)
    return delta, {k: torch.ones_like(v, dtype=torch.bool) for k, v in delta.items()}


def nested_aggregate(
    deltas: Sequence[Mapping[str, Tensor]],
    masks: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    level_masks: Sequence[Mapping[str, Tensor]],
) -> tuple[ParamDict, dict[str, Tensor]]:
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


def nested(levels: Sequence[float]) -> Aggregation:
    """:func:`nested_aggregate` over the width-``q`` slices of the global model, ``q`` in
    ``levels`` (ascending)."""
    return lambda deltas, masks, weights, state: nested_aggregate(
        deltas, masks, weights, [slice_masks(state.layers, q, state.params) for q in levels]
    )
