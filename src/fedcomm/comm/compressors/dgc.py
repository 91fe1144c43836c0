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

Two readings the DGC paper leaves open, as flags (defaults: the per-tensor reading above):

* ``scope: model`` takes one top-k over all update entries together (``k = ceil(d·Σ N)``), so a
  layer whose update is large (the output layer) gets more of the ``k`` than its size's share;
* ``vectors: dense`` sends the entries of 1-D parameters (biases) as they are, 32 bits each and
  no residual, as the official DGC code does (it compresses only ``param.dim() > 1``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedcomm.comm.codecs import Compressor, register_compressor
from fedcomm.comm.compressors._common import (
    Residuals,
    accumulate,
    check_density,
    is_update,
    keep_count,
    keep_mask,
    located_masks,
    store_residual,
    top_k_positions,
)
from fedcomm.comm.payload import Dense, Entry, Payload, Sparse


def warmup_density(density: float, warmup_rounds: int, round_: int) -> float:
    """The density of round ``round_`` (1-based): ``0.25**r`` during the warm-up, never below
    ``density``."""
    return max(density, 0.25**round_) if round_ <= warmup_rounds else density


def _param_ndim(payload: Payload, name: str) -> int:
    """Dimensions of the parameter an update entry belongs to: its ``keep/`` mask's shape for a
    masked (dropout-style) entry, else the entry's own."""
    mask = keep_mask(payload, name)
    if mask is not None:
        return mask.dim()
    entry = payload[name]
    assert isinstance(entry, Dense)
    return entry.values.dim()


def _split_positions(pos: Tensor, sizes: dict[str, int]) -> dict[str, Tensor]:
    """Positions in the concatenation of the entries (in ``sizes``' order) -> per-entry flat
    positions, ascending."""
    out: dict[str, Tensor] = {}
    start = 0
    for name, n in sizes.items():
        inside = (pos >= start) & (pos < start + n)
        out[name] = pos[inside] - start
        start += n
    return out


@register_compressor("dgc")
def dgc(
    density: float = 0.001,
    warmup_rounds: int = 4,
    index_bits: int = 64,
    scope: str = "tensor",
    vectors: str = "compress",
) -> Compressor:
    """Top-k with residual accumulation (state: entry name -> flat residual)."""
    check_density(density)
    if warmup_rounds < 0 or index_bits < 1:
        raise ValueError(
            f"need warmup_rounds >= 0, index_bits >= 1; got {warmup_rounds}, {index_bits}"
        )
    if scope not in ("tensor", "model") or vectors not in ("compress", "dense"):
        raise ValueError(
            f"dgc: scope must be tensor|model and vectors compress|dense; got {scope!r}, "
            f"{vectors!r}"
        )

    def encode(
        payload: Payload, state: Residuals, generator: torch.Generator, round_: int
    ) -> tuple[Payload, Residuals]:
        d = warmup_density(density, warmup_rounds, round_)
        new_state = dict(state)
        masks = located_masks(payload)
        acc = {  # name -> a = r + Δ, flat (N,)
            name: accumulate(state, name, entry.values.detach(), masks.get(name))
            for name, entry in payload.items()
            if is_update(entry) and (vectors == "compress" or _param_ndim(payload, name) > 1)
        }
        if scope == "tensor":
            pos = {n: top_k_positions(a, keep_count(d, a.numel())) for n, a in acc.items()}
        elif acc:
            flat = torch.cat(list(acc.values()))
            top = top_k_positions(flat, keep_count(d, flat.numel()))  # (k,) over all entries
            pos = _split_positions(top, {n: a.numel() for n, a in acc.items()})
        else:
            pos = {}  # no update entry to compress
        out: dict[str, Entry] = {}
        for name, entry in payload.items():
            if name not in acc:
                out[name] = entry
                continue
            a, p = acc[name], pos[name]  # p: (k_name,) -> k_name·(32 + index_bits) bits
            res = a.clone()
            res[p] = 0
            new_state[name] = store_residual(state, name, res, masks.get(name))
            assert isinstance(entry, Dense)
            out[name] = Sparse(a[p], p, tuple(entry.values.shape), "coo", index_bits)
        return Payload(out), new_state

    return Compressor("dgc", init=dict, encode=encode)
