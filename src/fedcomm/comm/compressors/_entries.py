"""Payload entries that only compressors produce. Each one implements the
:class:`~fedcomm.comm.payload.Entry` protocol and counts its bits through :mod:`fedcomm.comm.bits`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from fedcomm.comm import bits
from fedcomm.comm.payload import BitCount


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
        out = torch.zeros(_numel(self.shape), dtype=self.mu.dtype)
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
        one = torch.ones((), dtype=self.dtype)
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
