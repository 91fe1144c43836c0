"""Unstructured weight masks: the pure pieces FedDST, RandomMask and GraSP share.

Spec: ``specs/feddst-progfed.md`` §1(a), §1(c) (the official FedDST code, bibikar/feddst).

**Maskable weights** are the ``weight`` of every Conv/Linear layer, the first and the last
included; biases (and any other parameter) are always dense and outside the sparsity count. A
:data:`Masks` maps each maskable weight's name to a bool tensor of its shape (1 = active).

**Layer budgets** ``k_l(S)``, the weights layer ``l`` keeps at target sparsity ``S``
(``distribution``):

* ``official`` (the FedDST code's ``_weights_by_layer``, which it calls "erk"): raw sparsity
  ``s_l = 1 − Σ shape / Π shape`` of the weight (conv ``1 − (c_in + c_out + k_h + k_w) /
  (c_in c_out k_h k_w)``, linear ``1 − (c_in + c_out) / (c_in c_out)``); the *sparsities* are
  rescaled, ``s_l ← s_l · S Σ n / Σ s_l n_l`` with ``n_l`` = #weights + #biases, and
  ``k_l = ⌊(1 − s_l) n_l⌋``. A layer with ``k_l ≤ 0`` or ``k_l > #weights`` is skipped by the
  code, i.e. stays dense (budget = #weights). Nearly uniform; since ``n_l`` counts the biases,
  ``Σ k_l`` is a hair above ``(1 − S) N_m`` (the code's weight sparsity is just below ``S``).
* ``erk`` (RigL's Erdős–Rényi-kernel, Evci et al., ICML 2020): densities
  ``d_l = ε Σ shape / Π shape`` over weights only, ``ε`` solving ``Σ d_l w_l = (1 − S) Σ w_l``;
  a layer whose density would exceed 1 is made dense and ``ε`` solved again (RigL's loop).
* ``uniform``: ``d_l = 1 − S`` in every layer (weights only; the code's ``uniform`` would also
  count biases in ``n_l``).

``erk`` and ``uniform`` round by largest remainder, so ``Σ k_l = round((1 − S) N_m)`` exactly.

**Messages** (:func:`encode` / :func:`decode`): ``w/<name>`` the values of the active entries of
a masked weight (``Dense``, 32 bits each, row-major order of the mask) or a whole unmasked
tensor, and ``mask/<name>`` the mask: ``Mask`` (1 bit per entry) when it is sent, ``Free`` when
the receiver already holds it. Every size comes from :mod:`fedcomm.comm.bits` through the entries.
"""

from __future__ import annotations

import hashlib
import math
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from fedcomm.comm.payload import Dense, Entry, Free, Mask, Payload
from fedcomm.types import ParamDict

Masks = dict[str, Tensor]  # maskable weight name -> bool mask of its shape
Distribution = Literal["official", "erk", "uniform"]
# how a message pays for its masks: "sent" 1 bit per entry, "known" nothing (the receiver holds
# it), "kept" 1 bit per *active* entry (the FedDST code's upload count, d_k·N_m bits)
MaskCharge = Literal["sent", "known", "kept"]

VALUES = "w/"  # f"w/{param}": active values of a masked weight, or a whole unmasked tensor
MASK = "mask/"  # f"mask/{weight}": its mask (Mask, or Free when the receiver knows it)
MASK_COST = "maskcost/"  # f"maskcost/{weight}": the "kept" charge, one bit per active entry

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


# --- layer budgets -------------------------------------------------------------------------------


def layer_budgets(
    layers: Sequence[MaskLayer], sparsity: float, distribution: Distribution
) -> dict[str, int]:
    """``k_l(S)``: active weights per layer at target sparsity ``S`` (see the module docstring)."""
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    if distribution == "official":
        return official_budgets(layers, sparsity)
    if distribution == "erk":
        return _largest_remainder(layers, erk_densities(layers, sparsity))
    if distribution == "uniform":
        return _largest_remainder(layers, {la.name: 1.0 - sparsity for la in layers})
    raise ValueError(f"unknown distribution {distribution!r} (official, erk, uniform)")


def _raw_sparsity(layer: MaskLayer) -> float:
    """``1 − Σ shape / Π shape`` (conv: ``1 − (c_in + c_out + k_h + k_w)/(c_in c_out k_h k_w)``)."""
    return 1.0 - sum(layer.shape) / layer.numel


def official_budgets(layers: Sequence[MaskLayer], sparsity: float) -> dict[str, int]:
    """The FedDST code's rule: rescaled sparsities over weights + biases, floored, out-of-range
    layers skipped (kept dense)."""
    n = [la.numel + la.biases for la in layers]
    s = [_raw_sparsity(la) for la in layers]
    weighted = sum(si * ni for si, ni in zip(s, n, strict=True))
    scale = sparsity * sum(n) / weighted if weighted else 0.0
    out = {}
    for layer, si, ni in zip(layers, s, n, strict=True):
        kept = math.floor((1.0 - si * scale) * ni)
        out[layer.name] = kept if 0 < kept <= layer.numel else layer.numel  # skipped: dense
    return out


def erk_densities(layers: Sequence[MaskLayer], sparsity: float) -> dict[str, float]:
    """RigL's ERK densities, capped at 1 with the rest re-solved (``sparse_utils`` loop)."""
    dense: set[str] = set()
    while True:
        rhs = divisor = 0.0
        for la in layers:
            if la.name in dense:
                rhs -= la.numel * sparsity
            else:
                rhs += la.numel * (1.0 - sparsity)
                divisor += (1.0 - _raw_sparsity(la)) * la.numel
        eps = rhs / divisor if divisor else 0.0
        free = [la for la in layers if la.name not in dense]
        raw = {la.name: 1.0 - _raw_sparsity(la) for la in free}
        top = max(raw.values(), default=0.0)
        if not free or eps * top <= 1.0:
            break
        dense |= {name for name, r in raw.items() if r == top}
    return {la.name: 1.0 if la.name in dense else eps * raw[la.name] for la in layers}


def _largest_remainder(
    layers: Sequence[MaskLayer], densities: Mapping[str, float]
) -> dict[str, int]:
    """Counts ``⌊d_l w_l⌋`` plus one for the layers with the largest remainders (ties: earlier
    layer), so that they sum to ``round(Σ d_l w_l)``."""
    target = [min(densities[la.name], 1.0) * la.numel for la in layers]
    counts = [math.floor(t + 1e-9) for t in target]  # guard 0.2·250 = 49.99999...
    total = math.floor(sum(target) + 0.5)
    order = sorted(range(len(layers)), key=lambda i: -(target[i] - counts[i]))
    for i in order[: max(0, total - sum(counts))]:
        counts[i] = min(counts[i] + 1, layers[i].numel)
    return {la.name: c for la, c in zip(layers, counts, strict=True)}


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


# --- messages ------------------------------------------------------------------------------------


def encode(
    params: Mapping[str, Tensor],
    masks: Mapping[str, Tensor],
    mask_charge: MaskCharge,
    *,
    free_values: bool = False,
) -> Payload:
    """Active values of masked weights, other tensors whole (``Dense``, or ``Free`` when
    ``free_values``: regenerated from the seed), and the masks charged per ``mask_charge``."""
    entries: dict[str, Entry] = {}
    for name, t in params.items():
        values = (  # (nnz,) in row-major order (= t[mask]), or the whole tensor
            t.detach().reshape(-1).index_select(0, positions(masks[name]))
            if name in masks
            else t.detach()
        )
        entries[VALUES + name] = Free(values) if free_values else Dense(values)
    for name, m in masks.items():
        entries[MASK + name] = Mask(m) if mask_charge == "sent" else Free(m)
        if mask_charge == "kept":  # the FedDST code's count: d_k·N_m bits
            entries[MASK_COST + name] = Mask(
                torch.ones(int(m.sum()), dtype=torch.bool, device=m.device)
            )
    return Payload(entries)


def decode(decoded: Mapping[str, Tensor]) -> tuple[ParamDict, Masks]:
    """Inverse of :func:`encode` on a decoded payload: full tensors (zeros off the masks) and
    the masks."""
    masks = {k.removeprefix(MASK): v.bool() for k, v in decoded.items() if k.startswith(MASK)}
    params: ParamDict = {}
    for key, values in decoded.items():
        if not key.startswith(VALUES):
            continue
        name = key.removeprefix(VALUES)
        m = masks.get(name)
        if m is None:
            params[name] = values
            continue
        full = torch.zeros(m.shape, dtype=values.dtype, device=values.device)
        full.view(-1).index_copy_(0, positions(m), values.reshape(-1))  # = full[m] = values
        params[name] = full
    return params, masks


_POSITIONS: dict[int, tuple[weakref.ref[Tensor], Tensor]] = {}
_POSITIONS_KEPT = 16  # masks whose positions are remembered (a round shares one mask set)


def positions(mask: Tensor) -> Tensor:
    """The flat positions of ``mask``'s ones, ascending (``mask.reshape(-1).nonzero()``),
    remembered per mask object: the clients of a round share the server's masks, so gathering
    and scattering their values by position (``index_select``/``index_copy_``, ~10x faster than
    boolean indexing here) finds each mask's positions once. A mask must not change in place
    after its positions are taken (masks here are never modified in place)."""
    hit = _POSITIONS.get(id(mask))
    if hit is not None and hit[0]() is mask:
        return hit[1]
    found = mask.reshape(-1).nonzero().squeeze(1)
    if len(_POSITIONS) >= _POSITIONS_KEPT:
        _POSITIONS.pop(next(iter(_POSITIONS)))  # the oldest
    _POSITIONS[id(mask)] = (weakref.ref(mask), found)
    return found
