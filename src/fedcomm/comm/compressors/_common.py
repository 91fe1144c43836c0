"""Helpers shared by the compressors: which entries are updates, top-k, residuals."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import TypeGuard

import torch
from torch import Tensor

from fedcomm.comm.payload import Dense, Entry, Free, Payload

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


KEEP = "keep/"  # structured uplinks (FedDrop family, FedBIAD) send "keep/<param>" Free masks


def keep_mask(payload: Payload, name: str) -> Tensor | None:
    """The bool mask (in its parameter's shape) locating entry ``name``'s values in the full
    parameter, if the payload carries one (``keep/<param>`` next to ``<param>`` or
    ``w/<param>``)."""
    for key in (KEEP + name, KEEP + name.removeprefix("w/")):
        entry = payload.get(key)
        if isinstance(entry, Free) and entry.value.dtype == torch.bool:
            return entry.value
    return None


def located_masks(payload: Payload) -> dict[str, Tensor]:
    """Flat bool masks locating each update entry's values in its full parameter, where the
    payload carries them (:func:`keep_mask`)."""
    masks = {name: keep_mask(payload, name) for name in payload}
    return {name: m.reshape(-1) for name, m in masks.items() if m is not None}


def accumulate(
    residuals: Mapping[str, Tensor], name: str, update: Tensor, mask: Tensor | None = None
) -> Tensor:
    """``a = r + Δ`` over the sent values (flat).

    With a ``mask`` (the values are the masked entries of a full parameter, as in dropout-style
    uplinks) the residual is kept in full-parameter coordinates and read at the mask, so it
    follows each coordinate across rounds whatever rows are kept. Without one, a residual from
    an entry of another size is dropped (r = 0).
    """
    flat = update.reshape(-1)
    r = residuals.get(name)
    if mask is not None:
        return flat.clone() if r is None or r.shape != mask.shape else r[mask] + flat
    return flat.clone() if r is None or r.shape != flat.shape else r + flat


def store_residual(
    residuals: Mapping[str, Tensor], name: str, kept: Tensor, mask: Tensor | None
) -> Tensor:
    """The new residual: ``kept`` (flat, over the sent values), scattered into the full-size
    residual at ``mask`` when there is one (entries not sent this round keep theirs)."""
    if mask is None:
        return kept
    old = residuals.get(name)
    full = (
        torch.zeros(mask.shape, dtype=kept.dtype, device=kept.device)
        if old is None or old.shape != mask.shape
        else old.clone()
    )
    full[mask] = kept
    return full
