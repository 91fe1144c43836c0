"""FedPAQ: unbiased stochastic (QSGD-style) quantisation of each update tensor.

Reisizadeh et al., "FedPAQ: A Communication-Efficient Federated Learning Method with Periodic
Averaging and Quantization", AISTATS 2020 (arXiv:1909.13014); quantiser from Alistarh et al.,
"QSGD", NeurIPS 2017 (arXiv:1610.02132).

Per update entry ``x`` (``N`` values) with ``s`` levels::

    r_i = s · |x_i| / ‖x‖₂ ∈ [0, s]
    ξ_i = floor(r_i) + Bernoulli(r_i − floor(r_i))      # E[ξ_i] = r_i
    Q(x)_i = ‖x‖₂ · sign(x_i) · ξ_i / s                 # E[Q(x)] = x

The Bernoulli draws come from the client's generator. Bits: ``N·(1 + ceil(log2(s+1))) + 32``
per entry: ``8N + 32`` for ``s = 127``. The server averages the ``Q(Δ_k)`` (plain FedAvg).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedcomm.comm.codecs import Compressor, register_compressor
from fedcomm.comm.compressors._common import map_updates
from fedcomm.comm.compressors._entries import Quantized
from fedcomm.comm.payload import Payload


def quantize(x: Tensor, s: int, generator: torch.Generator) -> Quantized:
    """QSGD's unbiased stochastic quantisation of ``x`` onto ``s`` levels of ``‖x‖₂ / s``."""
    norm = torch.linalg.vector_norm(x)  # ()
    if float(norm) == 0.0:
        return Quantized(torch.zeros(x.shape, dtype=torch.int32, device=x.device), norm, s)
    r = x.abs() / norm * s  # in [0, s]
    low = torch.floor(r)
    # drawn on the generator's device (CPU), so the draws do not depend on x's device
    u = torch.rand(x.shape, generator=generator, dtype=x.dtype, device=generator.device)
    u = u.to(x.device)
    xi = (low + (u < r - low).to(x.dtype)).clamp_(0, s)
    return Quantized((torch.sign(x) * xi).to(torch.int32), norm, s)


@register_compressor("fedpaq")
def fedpaq(levels: int = 127) -> Compressor:
    """Per-tensor stochastic quantisation with ``levels`` magnitude levels (stateless)."""
    if levels < 1:
        raise ValueError(f"levels must be >= 1, got {levels}")

    def encode(
        payload: Payload, state: None, generator: torch.Generator, round_: int
    ) -> tuple[Payload, None]:
        return map_updates(payload, lambda name, v: quantize(v, levels, generator)), state

    return Compressor("fedpaq", init=lambda: None, encode=encode)
