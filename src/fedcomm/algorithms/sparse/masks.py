"""Unstructured weight masks: the pure pieces FedDST, RandomMask, GraSP and PruneFL share.

After the official FedDST code (bibikar/feddst @ 25d6184: ``models.py``, ``dst.py``).

**Maskable weights** are the ``weight`` of every Conv/Linear layer, the first and the last
included; biases (and any other parameter) are always dense and outside the sparsity count. A
:data:`Masks` maps each maskable weight's name to a bool tensor of its shape (1 = active).

Here: the maskable layers of a model, magnitude pruning to per-layer budgets, ``θ ⊙ m``,
FedDST's sparse averaging, and counts, density and a digest of a mask set. How many weights
each layer keeps is :mod:`.budgets`; how masked weights travel is :mod:`.codec`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedcomm.types import ParamDict

Masks = dict[str, Tensor]  # maskable weight name -> bool mask of its shape

_LAYERS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)


@dataclass(frozen=True)
class MaskLayer:
    """One maskable weight: its parameter name, shape ``(out, in, *kernel)`` and the number of
    bias entries of its layer (0 without a bias)."""

    name: str
    shape: tuple[int, ...]
    biases: int = 0

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def maskable_layers(model: nn.Module) -> tuple[MaskLayer, ...]:
    """The ``weight`` of every Conv/Linear layer of ``model``, in registration order (a weight
    shared between layers counts once, under the first name)."""
    seen: set[int] = set()
    out = []
    for prefix, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not isinstance(module, _LAYERS) or not isinstance(weight, Tensor):
            continue
        if id(weight) in seen:
            continue
        seen.add(id(weight))
        bias = module.bias if isinstance(module.bias, Tensor) else None
        name = f"{prefix}.weight" if prefix else "weight"
        out.append(MaskLayer(name, tuple(weight.shape), bias.numel() if bias is not None else 0))
    return tuple(out)


def ones(layers: Sequence[MaskLayer], device: torch.device | str = "cpu") -> Masks:
    """The all-ones (dense) mask of ``layers`` on ``device``."""
    return {
        layer.name: torch.ones(layer.shape, dtype=torch.bool, device=device) for layer in layers
    }


# --- pruning, averaging, churn -------------------------------------------------------------------


def top_k(scores: Tensor, k: int, candidates: Tensor | None = None) -> Tensor:
    """Bool mask (shape of ``scores``) of the ``k`` largest ``scores`` among ``candidates`` (all
    entries if None; at most as many as there are); ties go to the lower flat index."""
    flat = scores.reshape(-1)
    idx = (
        torch.arange(flat.numel(), device=flat.device)
        if candidates is None
        else torch.nonzero(candidates.reshape(-1), as_tuple=False).reshape(-1)
    )  # (n_candidates,)
    k = max(0, min(k, int(idx.numel())))
    order = torch.sort(flat[idx], descending=True, stable=True).indices[:k]  # (k,)
    out = torch.zeros(flat.numel(), dtype=torch.bool, device=flat.device)
    out[idx[order]] = True
    return out.reshape(scores.shape)


def prune_to_budgets(
    params: Mapping[str, Tensor], masks: Mapping[str, Tensor], budgets: Mapping[str, int]
) -> Masks:
    """Layer-wise magnitude pruning: the ``budgets[l]`` largest ``|θ|`` among the active entries
    of each mask (a layer with fewer active entries keeps them all)."""
    return {name: top_k(params[name].abs(), budgets[name], m) for name, m in masks.items()}


def apply_masks(params: Mapping[str, Tensor], masks: Mapping[str, Tensor]) -> ParamDict:
    """``θ ⊙ m`` for masked weights, other tensors unchanged (new dict, inputs untouched)."""
    return {k: torch.where(masks[k], v, 0.0) if k in masks else v for k, v in params.items()}


def masked_average(
    values: Sequence[Mapping[str, Tensor]],
    masks: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
) -> tuple[ParamDict, Masks]:
    """FedDST's sparse averaging ``(θ, union)``.

    For a masked weight, entrywise ``θ_j = Σ_k w_k m_kj θ_kj / Σ_k w_k m_kj`` (0 where no client
    kept ``j``) and ``union_j = 1[Σ_k w_k m_kj > 0]``; other tensors ``Σ_k w_k θ_k / Σ_k w_k``.
    """
    if not values:
        raise ValueError("masked_average of no clients")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"weights must sum to > 0, got {list(weights)}")
    out: ParamDict = {}
    union: Masks = {}
    for name, ref in values[0].items():
        num = torch.zeros_like(ref)
        if name not in masks[0]:
            for v, w in zip(values, weights, strict=True):
                num.add_(v[name], alpha=w / total)
            out[name] = num
            continue
        shared = masks[0][name]
        if all(m[name] is shared for m in masks):  # every client kept the same entries
            # on the mask, the same float sums as below; off it, the result is 0 either way
            # (so the values need no masking); den is the one running sum of the weights
            weight_sum = torch.zeros((), dtype=ref.dtype, device=ref.device)
            for v, w in zip(values, weights, strict=True):
                num.add_(v[name], alpha=w)
                weight_sum.add_(w)
            den = torch.where(shared, weight_sum, 0.0)
        else:
            den = torch.zeros_like(ref)
            for v, m, w in zip(values, masks, weights, strict=True):
                num.add_(torch.where(m[name], v[name], 0.0), alpha=w)
                den.add_(m[name].to(ref.dtype), alpha=w)
        union[name] = den > 0
        out[name] = torch.where(union[name], num / den.clamp_min(1e-30), 0.0)
    return out, union


def changed(old: Mapping[str, Tensor], new: Mapping[str, Tensor]) -> int:
    """Hamming distance between two mask sets (entries whose bit differs)."""
    return sum(int(torch.count_nonzero(old[k] ^ new[k])) for k in old)


def count(masks: Mapping[str, Tensor]) -> tuple[int, int]:
    """``(active, total)`` entries of a mask set."""
    return (
        sum(int(torch.count_nonzero(m)) for m in masks.values()),
        sum(m.numel() for m in masks.values()),
    )


def density(masks: Mapping[str, Tensor]) -> float:
    """Fraction of maskable entries that are active (1.0 for no masks)."""
    active, total = count(masks)
    return active / total if total else 1.0


def digest(masks: Mapping[str, Tensor]) -> str:
    """A content hash of a mask set (names, shapes and bits): equal masks, equal digests."""
    h = hashlib.blake2b(digest_size=16)
    for name in sorted(masks):
        m = masks[name]
        h.update(f"{name}:{tuple(m.shape)};".encode())
        h.update(m.to(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()
