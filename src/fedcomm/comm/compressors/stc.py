"""STC: sparse ternary compression with a per-client residual (uplink only).

Sattler et al., "Robust and Communication-Efficient Federated Learning from Non-IID Data",
IEEE TNNLS 2020 (arXiv:1903.02891).

Per client and update entry (flattened, ``N`` values)::

    a   = res + Δ
    k   = ceil(density · N)              # at most the non-zeros of a
    μ   = mean |a_i| over the top-k of |a|
    T   = μ · sign(a) on the top-k, 0 elsewhere
    res ← a − T

Bits: ``k·(1 + index_bits) + 32`` per entry (a sign bit and a coordinate per kept value, one μ
per tensor, as the reference code does; 65 bits per value with 64-bit positions). The server
averages the ``T_k`` (any averaging algorithm does). The original also compresses the downlink;
like FedBIAD's comparison this is uplink only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedcomm.comm.codecs import Compressor, register_compressor
from fedcomm.comm.compressors._common import (
    Residuals,
    accumulate,
    check_density,
    keep_count,
    located_masks,
    map_updates,
    store_residual,
    top_k_positions,
)
from fedcomm.comm.compressors._entries import Ternary
from fedcomm.comm.payload import Payload


@register_compressor("stc")
def stc(density: float = 1 / 400, index_bits: int = 64) -> Compressor:
    """Top-k ternarisation with residual accumulation (state: entry name -> flat residual)."""
    check_density(density)
    if index_bits < 1:
        raise ValueError(f"index_bits must be >= 1, got {index_bits}")

    def encode(
        payload: Payload, state: Residuals, generator: torch.Generator, round_: int
    ) -> tuple[Payload, Residuals]:
        new_state = dict(state)
        masks = located_masks(payload)

        def one(name: str, values: Tensor) -> Ternary:
            a = accumulate(state, name, values, masks.get(name))  # (N,)
            pos = top_k_positions(a, keep_count(density, a.numel()))  # (k,)
            kept = a[pos]
            mu = (
                kept.abs().mean()
                if pos.numel()
                else torch.zeros((), dtype=a.dtype, device=a.device)
            )
            entry = Ternary(pos, kept > 0, mu, tuple(values.shape), index_bits)
            new_state[name] = store_residual(
                state, name, a - entry.decode().reshape(-1), masks.get(name)
            )
            return entry

        return map_updates(payload, one), new_state

    return Compressor("stc", init=dict, encode=encode)
