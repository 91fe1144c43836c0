"""Helpers shared by the compressors: which entries are updates, top-k, residuals."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import TypeGuard

import torch
from torch import Tensor

from fedcomm.comm.payload import Dense, Entry, Payload

Residuals = dict[str, Tensor]  # entry name -> flat residual (N,)


def is_update(entry: Entry) -> TypeGuard[Dense]:
    """Only float ``Dense`` entries carry update values; everything else passes through."""
    return isinstance(entry, Dense) and entry.values.is_floating_point()


def map_updates(payload: Payload, fn: Callable[[str, Tensor], Entry]) -> Payload:
    """``fn(name, values)`` on every update entry; the other entries kept as the same objects."""
    return Payload({k: fn(k, e.values.detach()) if is_update(e) else e for k, e in payload.items()})


def check_density(density: float) -> None:
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")


def keep_count(density: float, numel: int) -> int:
    """``k = ceil(density · numel)``, computed exactly on the decimal form of ``density`` (so
    ``0.1 · 30`` is 3, not 4), at most ``numel``; at least 1 for a non-empty tensor."""
    return min(numel, math.ceil(Fraction(repr(float(density))) * numel))


def top_k_positions(a: Tensor, k: int) -> Tensor:
    """Ascending flat positions of the ``k`` largest ``|a|``, never a zero of ``a``."""
    k = min(k, int(torch.count_nonzero(a)))
    idx = torch.topk(a.abs(), k, sorted=False).indices  # (k,) int64
    return torch.sort(idx).values


def accumulate(residuals: Mapping[str, Tensor], name: str, update: Tensor) -> Tensor:
    """``a = r + Δ`` (flat). A residual from an entry of another size is dropped (r = 0)."""
    flat = update.reshape(-1)
    r = residuals.get(name)
    return flat.clone() if r is None or r.shape != flat.shape else r + flat
