"""The sub-model family's unit graph and selection rules: which units each layer keeps.

A *unit* is a row of a hidden layer (a linear layer's output unit, a conv filter) of
``rows(model)`` for a sequential Linear/Conv chain (``mlp``, ``cnn``, ``mnist_cnn``). A dropped
unit takes its weight row and bias and the next layer's input columns reading it (after a
flatten, the ``in_features / channels`` consecutive columns of its channel): :func:`param_masks`.

A **selection rule** ranks a layer's units, best first (:data:`Rank`); the sub-model keeps the
first ``n_keep`` of the ranking (:func:`keep_ranked`), ``n_keep`` per layer coming from a count
rule (:func:`keep_counts`, :func:`width_counts`). :func:`select` applies a rule layer by layer in
layer order, so rules drawing from one generator draw in that order. The family's rules:

* random (FedDrop): a uniformly random permutation per ``(seed, round, client)``;
* loss-adaptive (AFD): score-weighted sampling without replacement, topped up at random;
* L1-ranked (FedMP): units by descending L1 norm (stable);
* ordered (HeteroFL, FjORD): the index order, so a width-``r`` sub-model is a prefix
  (:func:`ordered`, :func:`slice_masks`);
* score-ranked (FedBIAD's stage two: the rows' Bayesian scores ``E``, Eq. 9): by descending
  score, ties in random order (:func:`score_ranking`, :func:`by_score`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor, nn

from fedcomm.models.groups import GroupSpec, expand_mask, rows
from fedcomm.models.vision import MLP, ConvNet

# (layer, n_keep) -> unit indices, best first (at least the first n_keep, distinct)
Rank = Callable[[GroupSpec, int], Tensor]

_EPS = 1e-9  # ceil(0.7·10) must be 7, not 8 (0.7·10 = 7.000000000000001 in floating point)


def unit_layers(model: nn.Module | None, algorithm: str = "feddrop") -> tuple[GroupSpec, ...]:
    """``rows(model)`` if ``model`` is a sequential Linear/Conv chain, else a ValueError naming
    ``algorithm``."""
    specs = tuple(rows(model)) if isinstance(model, MLP | ConvNet) else ()
    params = dict(model.named_parameters()) if model is not None else {}
    pairs = itertools.pairwise(specs)
    if not specs or any(params[b.members[0][0]].shape[1] % a.count for a, b in pairs):
        raise ValueError(
            f"{algorithm} supports the sequential models mlp, cnn and mnist_cnn (and needs the "
            f"model in the round context), not {type(model).__name__}: sub-models of residual "
            "or recurrent models are not implemented"
        )
    return specs


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


# --- how many units a layer keeps -------------------------------------------------------------


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


def keep_counts(layers: Sequence[GroupSpec], p: float) -> dict[str, int]:
    """Units kept per layer: ``count − round(p·count)`` (at least one), the output layer full."""
    dropped = drop_counts(layers, conv_rate=p, fc_rate=p, drop_output=False)
    return {s.name: s.count - dropped[s.name] for s in layers}


def width_units(rate: float, count: int) -> int:
    """``ceil(rate·count)`` units (at least one), robust to floating-point noise."""
    return min(count, max(1, math.ceil(rate * count - _EPS)))


def width_counts(layers: Sequence[GroupSpec], rate: float) -> dict[str, int]:
    """Units of the width-``rate`` sub-model: ``ceil(rate·count)`` per hidden layer, the output
    layer full."""
    return {s.name: s.count if s.is_output else width_units(rate, s.count) for s in layers}


# --- which units ------------------------------------------------------------------------------


def keep_ranked(ranking: Tensor, n_keep: int, count: int) -> Tensor:
    """``(count,)`` bool on ``ranking``'s device: the first ``n_keep`` units of ``ranking``."""
    keep = torch.zeros(count, dtype=torch.bool, device=ranking.device)
    keep[ranking[:n_keep]] = True
    return keep


def score_ranking(scores: Tensor, generator: torch.Generator) -> Tensor:
    """Unit indices ``(count,)`` by descending ``scores``, ties in uniformly random order."""
    perm = torch.randperm(scores.numel(), generator=generator, device=generator.device)
    return perm[torch.sort(scores[perm], descending=True, stable=True).indices]


def by_score(scores: Mapping[str, Tensor], generator: torch.Generator) -> Rank:
    """The score-ranked rule: each layer's units by descending ``scores[layer]``, ties at random."""
    return lambda spec, n_keep: score_ranking(scores[spec.name], generator)


def select(layers: Sequence[GroupSpec], counts: Mapping[str, int], rank: Rank) -> dict[str, Tensor]:
    """Unit keep masks ``(count,)`` per layer, exactly ``counts[layer]`` units each: the first of
    ``rank``'s ranking, layer by layer in layer order."""
    return {s.name: keep_ranked(rank(s, counts[s.name]), counts[s.name], s.count) for s in layers}


def ordered(spec: GroupSpec, n_keep: int) -> Tensor:
    """The ordered rule (HeteroFL, FjORD): units in index order, so the sub-model is a prefix."""
    return torch.arange(spec.count, device="cpu")  # (moved to each param by param_masks)


def first_units(layers: Sequence[GroupSpec], rate: float) -> dict[str, Tensor]:
    """Keep masks ``(count,)`` per layer: the first ``ceil(rate·count)`` units of every hidden
    layer, every unit of the output layer."""
    return select(layers, width_counts(layers, rate), ordered)


def slice_masks(
    layers: Sequence[GroupSpec], rate: float, params: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Full-shape bool masks of the width-``rate`` sub-model (:func:`param_masks` of
    :func:`first_units`)."""
    return param_masks(layers, first_units(layers, rate), params)
