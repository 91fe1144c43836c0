"""The sparse family's messages: masked weights and their masks as payload entries.

After the official FedDST code's communication accounting (bibikar/feddst @ 25d6184, ``dst.py``).

:func:`encode` / :func:`decode`: ``w/<name>`` the values of the active entries of a masked
weight (``Dense``, 32 bits each, row-major order of the mask) or a whole unmasked tensor, and
``mask/<name>`` the mask: ``Mask`` (1 bit per entry) when it is sent, ``Free`` when the receiver
already holds it. Every size comes from :mod:`fedcomm.comm.bits` through the entries.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from typing import Literal

import torch
from torch import Tensor

from fedcomm.algorithms.sparse.masks import Masks
from fedcomm.comm.payload import Dense, Entry, Free, Mask, Payload
from fedcomm.types import ParamDict

# how a message pays for its masks: "sent" 1 bit per entry, "known" nothing (the receiver holds
# it), "kept" 1 bit per *active* entry (the FedDST code's upload count, d_k·N_m bits)
MaskCharge = Literal["sent", "known", "kept"]

VALUES = "w/"  # f"w/{param}": active values of a masked weight, or a whole unmasked tensor
MASK = "mask/"  # f"mask/{weight}": its mask (Mask, or Free when the receiver knows it)
MASK_COST = "maskcost/"  # f"maskcost/{weight}": the "kept" charge, one bit per active entry


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
