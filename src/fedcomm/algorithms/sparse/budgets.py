"""Layer budgets ``k_l(S)``: the weights each maskable layer keeps at target sparsity ``S``.

After the official FedDST code's layer budgets (bibikar/feddst @ 25d6184, ``models.py``).

Three rules (``distribution``):

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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from fedcomm.algorithms.sparse.masks import MaskLayer

Distribution = Literal["official", "erk", "uniform"]


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
