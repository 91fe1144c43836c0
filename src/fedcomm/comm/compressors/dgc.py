"""DGC: top-k sparsification with a per-client residual and a sparsity warm-up.

Lin et al., "Deep Gradient Compression: Reducing the Communication Bandwidth for Distributed
Training", ICLR 2018 (arXiv:1712.01887).

Per client and update entry (flattened, ``N`` values), in round ``r``::

    a   = res + Δ                       # error feedback
    k   = ceil(density_r · N)           # at most the non-zeros of a
    T   = top-k of |a| (values + coordinates)
    res ← a − T                         # exactly: the kept coordinates are zeroed

``density_r = max(density, 0.25**r)`` for ``r ≤ warmup_rounds``, else ``density``: with the
defaults 25%, 6.25%, 1.5625%, 0.39%, then 0.1% (the paper's 75%, 93.75%, 98.4375%, 99.6%, 99.9%
sparsity, over rounds instead of epochs). Bits: ``k·(32 + index_bits)`` per entry, 96 with the
FedBIAD convention of 64-bit positions. Not included (plain local SGD here, as the spec
recommends): momentum correction, momentum-factor masking, local gradient clipping.
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
from fedcomm.comm.payload import Payload, Sparse


def warmup_density(density: float, warmup_rounds: int, round_: int) -> float:
    """The density of round ``round_`` (1-based): ``0.25**r`` during the warm-up, never below
    ``density``."""
    return max(density, 0.25**round_) if round_ <= warmup_rounds else density


@register_compressor("dgc")
def dgc(density: float = 0.001, warmup_rounds: int = 4, index_bits: int = 64) -> Compressor:
    """Top-k with residual accumulation (state: entry name -> flat residual)."""
    check_density(density)
    if warmup_rounds < 0 or index_bits < 1:
        raise ValueError(
            f"need warmup_rounds >= 0, index_bits >= 1; got {warmup_rounds}, {index_bits}"
        )

    def encode(
        payload: Payload, state: Residuals, generator: torch.Generator, round_: int
    ) -> tuple[Payload, Residuals]:
        d = warmup_density(density, warmup_rounds, round_)
        new_state = dict(state)
        masks = located_masks(payload)

        def one(name: str, values: Tensor) -> Sparse:
            a = accumulate(state, name, values, masks.get(name))  # (N,)
            pos = top_k_positions(a, keep_count(d, a.numel()))  # (k,) -> k·index_bits bits
            sent = a[pos]  # (k,) -> k·32 bits
            res = a.clone()
            res[pos] = 0
            new_state[name] = store_residual(state, name, res, masks.get(name))
            return Sparse(sent, pos, tuple(values.shape), "coo", index_bits)

        return map_updates(payload, one), new_state

    return Compressor("dgc", init=dict, encode=encode)
