"""Payload entries that only compressors produce. Each one implements the
:class:`~fedcomm.comm.payload.Entry` protocol and counts its bits through :mod:`fedcomm.comm.bits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedcomm.comm import bits
from fedcomm.comm.compressors import _lq
from fedcomm.comm.payload import BitCount, Dense


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclass(frozen=True)
class Ternary:
    """STC's message: ``k`` positions, a sign bit each and one magnitude ``mu``.

    Decodes to ``+mu``/``-mu`` at ``positions`` and zeros elsewhere.
    Bits: ``k`` sign bits + ``k·index_bits`` (coordinates) + 32 (``mu``).
    """

    positions: Tensor  # (k,) int64 flat indices, ascending
    signs: Tensor  # (k,) bool, True = +mu
    mu: Tensor  # () float
    shape: tuple[int, ...]
    index_bits: int | None = 64

    def decode(self) -> Tensor:
        out = torch.zeros(_numel(self.shape), dtype=self.mu.dtype, device=self.mu.device)
        out[self.positions] = torch.where(self.signs, self.mu, -self.mu)
        return out.reshape(self.shape)

    def nbits(self) -> BitCount:
        k = int(self.positions.numel())
        return BitCount(
            payload=bits.dense(k, value_bits=1),  # k sign bits
            index=bits.coo(k, _numel(self.shape), self.index_bits),  # k·64
            meta=bits.meta(1),  # mu
        )

    def dense_bits(self) -> int:
        return bits.dense(_numel(self.shape))


@dataclass(frozen=True)
class Signs:
    """SignSGD's message: one sign bit per value (``True`` = +1), optionally one scale.

    Decodes to ``±1`` (or ``±scale``). Bits: ``numel`` (+32 with a scale).
    """

    signs: Tensor  # bool, the dense shape
    scale: Tensor | None = None  # () float
    dtype: torch.dtype = torch.float32

    def decode(self) -> Tensor:
        one = torch.ones((), dtype=self.dtype, device=self.signs.device)
        out = torch.where(self.signs, one, -one)
        return out if self.scale is None else out * self.scale.to(self.dtype)

    def nbits(self) -> BitCount:
        scales = 0 if self.scale is None else 1
        return BitCount(
            payload=bits.dense(self.signs.numel(), value_bits=1), meta=bits.meta(scales)
        )

    def dense_bits(self) -> int:
        return bits.dense(self.signs.numel())


@dataclass(frozen=True)
class Quantized:
    """FedPAQ/QSGD's message: a signed level in ``{-s..s}`` per value and the tensor's norm.

    Decodes to ``norm · level / s``. Bits: ``numel·(1 + ceil(log2(s+1)))`` + 32 (the norm).
    """

    levels: Tensor  # int32, the dense shape, in [-s, s]
    norm: Tensor  # () float, ‖x‖₂
    s: int

    def decode(self) -> Tensor:
        return self.norm * self.levels.to(self.norm.dtype) / self.s

    def nbits(self) -> BitCount:
        width = bits.quantized_width(self.s)  # s = 127: 8
        return BitCount(payload=bits.dense(self.levels.numel(), width), meta=bits.meta(1))

    def dense_bits(self) -> int:
        return bits.dense(self.levels.numel())


@dataclass(frozen=True)
class LinearQuantized:
    """ProgFed's LQ-b message: uint8 levels of the (rotated) matrix ``Y``, ``v_min``, ``v_max``
    and the seed of the rotation's sign flips ``D`` (see :mod:`fedcomm.comm.compressors._lq`).

    Decodes to ``X̂ = H⁻¹((q·(v_max − v_min)/(2^b − 1) + v_min) ⊙ D)`` (no ``H``, ``D`` without a
    rotation), reshaped to ``shape``. Bits: ``levels.numel()·b`` (padded rows included) +
    ``2·32`` (``v_min``, ``v_max``) + 32 (the seed) when rotated.
    """

    levels: Tensor  # uint8 (rows, n2) in [0, 2^b - 1]; rows = n1, or 2^k with "padded"
    v_min: Tensor  # () float32
    v_max: Tensor  # () float32
    bits: int
    shape: tuple[int, ...]  # the decoded shape
    rotation: _lq.Rotation = "none"
    seed: int | None = None  # D's seed; None without a rotation
    dtype: torch.dtype = torch.float32

    def decode(self) -> Tensor:
        y = _lq.dequantize(self.levels, self.v_min, self.v_max, self.bits)
        n1, _ = _lq.matrix_shape(self.shape)
        return _lq.unrotate(y, self.rotation, self.seed, n1).to(self.dtype).reshape(self.shape)

    def nbits(self) -> BitCount:
        return BitCount(
            payload=bits.linear_quantized(self.levels.numel(), self.bits),
            meta=bits.linear_quantized_meta(self.rotation != "none"),
        )

    def dense_bits(self) -> int:
        return bits.dense(_numel(self.shape))


def bernoulli_mask(
    seed: int, keep: float, numel: int, device: torch.device | str = "cpu"
) -> Tensor:
    """A flat bool mask on ``device``, each entry kept with probability ``keep``, from
    ``torch.Generator().manual_seed(seed)`` (the sender and the receiver draw the same one; it is
    drawn on the CPU whatever ``device``, so it does not depend on the device)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.rand(numel, generator=g, dtype=torch.float64, device="cpu") < keep).to(device)


@dataclass(frozen=True)
class SeededSparse:
    """ProgFed's SP-p message: the values kept by a Bernoulli(``keep``) mask, already divided by
    ``keep``, and the mask's seed; the receiver regenerates the mask, so no index is sent.

    ``values`` is the flat ``(nnz,)`` vector of kept values in mask order, as fp32 ``Dense`` or
    LQ-b quantised (:class:`LinearQuantized`). Decodes to them scattered into zeros. Bits: those
    of ``values`` + 32 (the seed).
    """

    values: Dense | LinearQuantized
    seed: int
    keep: float
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    def decode(self) -> Tensor:
        numel = _numel(self.shape)
        values = self.values.decode().to(self.dtype)
        out = torch.zeros(numel, dtype=self.dtype, device=values.device)
        out[bernoulli_mask(self.seed, self.keep, numel, values.device)] = values
        return out.reshape(self.shape)

    def nbits(self) -> BitCount:
        return self.values.nbits() + BitCount(meta=bits.seeded_mask())

    def dense_bits(self) -> int:
        return bits.dense(_numel(self.shape))
