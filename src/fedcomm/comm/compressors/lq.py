"""ProgFed's LQ-b: per-tensor linear stochastic quantisation after a random Hadamard rotation.

Wang et al., "ProgFed: Effective, Communication, and Computation Efficient Federated Learning by
Progressive Training", ICML 2022 (arXiv:2110.05323), uplink only, "following Konečný et al.
2016" (Section 4.4, Table 5; official code: a514514772/ProgFed ``quantization.py``).

Per update entry viewed as ``X`` of shape ``n1 × n2`` (``n1`` = its first dim; 1-D: ``numel × 1``)::

    Y = (H·X) ⊙ D                                       # H: Hadamard along dim 0, D: ±1 from a seed
    u = (Y − v_min)/(v_max − v_min)·(2^b − 1)           # v_min = min Y, v_max = max Y
    q = ⌈u⌉ − 1[ξ < ⌈u⌉ − u],  ξ ~ U(0, 1)              # E[q] = u, stored as uint8
    X̂ = H⁻¹((q·(v_max − v_min)/(2^b − 1) + v_min) ⊙ D)  # E[X̂] = X

``rotation``: ``truncated`` (the official code: ``H`` = the ±1 Sylvester Hadamard of order
``2^⌈log2 n1⌉`` truncated to ``n1 × n1``, inverted exactly in O(n log n), see
:mod:`fedcomm.comm.compressors._lq`), ``padded`` (``X`` padded with zero rows to ``2^k`` and the
orthonormal ``H/√(2^k)``; the padded entries are quantised and sent) or ``none`` (``Y = X``).
The seed of ``D`` and the rounding noise ``ξ`` come from the client's generator; ``D`` is
regenerated from its seed at decode. A constant ``Y`` (``v_max = v_min``) decodes exactly.

Bits per entry: ``rows·n2·b`` (``rows`` = ``n1``, or ``2^k`` when padded) + ``2·32`` for
``v_min``, ``v_max`` + 32 for the seed of ``D`` when rotated: LQ-8 of a rotated ``10 × 7``
tensor is ``560 + 96``. The server averages the ``X̂_k`` (plain FedAvg).
"""

from __future__ import annotations

import torch
from torch import Tensor

from fedcomm.comm.codecs import Compressor, register_compressor
from fedcomm.comm.compressors import _lq
from fedcomm.comm.compressors._common import map_updates
from fedcomm.comm.compressors._entries import LinearQuantized
from fedcomm.comm.payload import Payload


def quantize(
    x: Tensor, bits: int, rotation: _lq.Rotation, generator: torch.Generator
) -> LinearQuantized:
    """LQ-``bits`` of ``x`` (any shape; an empty tensor is sent unrotated, levels-free)."""
    _lq.check_options(bits, rotation)
    shape = tuple(x.shape)
    n1, n2 = _lq.matrix_shape(shape)
    if x.numel() == 0:
        rotation = "none"
    seed = None if rotation == "none" else _lq.draw_seed(generator)
    y = _lq.rotate(x.detach().reshape(n1, n2), rotation, seed)
    q, v_min, v_max = _lq.quantize_levels(y, bits, generator)
    return LinearQuantized(q, v_min, v_max, bits, shape, rotation, seed, x.dtype)


@register_compressor("lq")
def lq(bits: int = 8, rotation: str = "truncated") -> Compressor:
    """Per-tensor LQ-``bits`` with a ``rotation`` of dim 0 (stateless)."""
    _lq.check_options(bits, rotation)
    rot: _lq.Rotation = rotation  # type: ignore[assignment]  # checked above

    def encode(
        payload: Payload, state: None, generator: torch.Generator, round_: int
    ) -> tuple[Payload, None]:
        return map_updates(payload, lambda name, v: quantize(v, bits, rot, generator)), state

    return Compressor("lq", init=lambda: None, encode=encode)
