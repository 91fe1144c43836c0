"""Divergence: a client whose training loss is non-finite or exploded, or whose decoded update
holds a non-finite value. ``train.on_divergence`` says what the loop does: ``stop`` raises
:class:`DivergenceError`, ``skip`` leaves the client out of the aggregation (its messages are
still charged)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor


class DivergenceError(RuntimeError):
    """A client's training loss is non-finite or exploded, or its update is non-finite."""


def diverged(loss: float | None, update: Mapping[str, Tensor], limit: float) -> str | None:
    """Why a client's round diverged, or None: a loss that is NaN, infinite or above ``limit``
    (``None``: the algorithm reports none), or a non-finite value in its decoded update."""
    if loss is not None and not loss <= limit:  # NaN compares false
        return f"training loss {loss:.4g}" + ("" if math.isnan(loss) else f" (limit {limit:g})")
    floats = [(n, t) for n, t in update.items() if t.is_floating_point() and t.numel()]
    if not floats:
        return None
    # fast path: a finite sum means every value is finite (NaN and ±inf propagate); a non-finite
    # sum may also be an overflow of huge finite values, so only then is each value checked
    # (one device for the stack: an update may keep a scalar, AFD's uploaded loss, on the CPU)
    device = floats[0][1].device
    sums = torch.stack([t.sum().to(device) for _, t in floats])
    if bool(torch.isfinite(sums).all()):  # one read back per client
        return None
    bad = next((n for n, t in floats if not bool(torch.isfinite(t).all())), None)
    return None if bad is None else f"a non-finite value in its update of {bad}"
