"""Payload objects: what one message actually carries, and its exact size.

A :class:`Payload` maps entry names (usually parameter names) to encoded entries. Each entry
knows how to ``decode()`` itself back to a dense tensor and how many bits it costs, split into
``payload`` (values), ``index`` (positions: bitmaps or coordinates) and ``meta`` bits. All sizes
route through :mod:`fedcomm.comm.bits`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from fedcomm.comm import bits


@dataclass(frozen=True)
class BitCount:
    """Bits of one message, by kind."""

    payload: int = 0
    index: int = 0
    meta: int = 0

    @property
    def total(self) -> int:
        return self.payload + self.index + self.meta

    def __add__(self, other: BitCount) -> BitCount:
        return BitCount(
            self.payload + other.payload, self.index + other.index, self.meta + other.meta
        )


@runtime_checkable
class Entry(Protocol):
    """One encoded tensor (or scalar) inside a payload."""

    def decode(self) -> Tensor: ...

    def nbits(self) -> BitCount: ...

    def dense_bits(self) -> int: ...


@dataclass(frozen=True)
class Dense:
    """A dense tensor sent value by value: ``value_bits`` per entry (default: its dtype's width,
    32 for fp32)."""

    values: Tensor
    value_bits: int | None = None

    def decode(self) -> Tensor:
        return self.values

    def nbits(self) -> BitCount:
        width = self.value_bits if self.value_bits is not None else _dtype_bits(self.values)
        return BitCount(payload=bits.dense(self.values.numel(), width))

    def dense_bits(self) -> int:
        return bits.dense(self.values.numel())


def _dtype_bits(t: Tensor) -> int:
    return 1 if t.dtype == torch.bool else t.element_size() * 8


@dataclass(frozen=True)
class Sparse:
    """Non-zero values plus their positions, as a bitmap or as coordinate indices.

    ``values`` is ``(nnz,)`` in row-major order of ``positions``; ``shape`` the dense shape.
    ``fmt`` is the structure actually sent; ``index_bits`` fixes the width of a coordinate.
    """

    values: Tensor  # (nnz,)
    positions: Tensor  # (nnz,) int64 flat indices, ascending
    shape: tuple[int, ...]
    fmt: bits.IndexFormat = "auto"
    index_bits: int | None = None
    value_bits: int = bits.FLOAT_BITS

    def decode(self) -> Tensor:
        values = self.values
        out = torch.zeros(self.shape, dtype=values.dtype, device=values.device).reshape(-1)
        out[self.positions] = values
        return out.reshape(self.shape)

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def nbits(self) -> BitCount:
        nnz = int(self.values.numel())
        return BitCount(
            payload=bits.dense(nnz, self.value_bits),
            index=bits.sparse_index(nnz, self.numel, self.fmt, self.index_bits),
        )

    def dense_bits(self) -> int:
        return bits.dense(self.numel)


@dataclass(frozen=True)
class Mask:
    """A binary mask sent as one bit per element (groups, rows or entries)."""

    mask: Tensor  # bool

    def decode(self) -> Tensor:
        return self.mask

    def nbits(self) -> BitCount:
        return BitCount(payload=bits.mask(self.mask.numel()))

    def dense_bits(self) -> int:
        return bits.mask(self.mask.numel())


@dataclass(frozen=True)
class Meta:
    """Scalar metadata (a scale, a seed, a count) of ``width`` bits each."""

    value: Tensor
    width: int = bits.META_BITS

    def decode(self) -> Tensor:
        return self.value

    def nbits(self) -> BitCount:
        return BitCount(meta=bits.meta(self.value.numel(), self.width))

    def dense_bits(self) -> int:
        return bits.meta(self.value.numel(), self.width)


@dataclass(frozen=True)
class Free:
    """Something the receiver can regenerate at no cost (e.g. a mask from a shared seed).

    Costs zero bits; use only where the paper's counting rule says so (and say so in a flag).
    """

    value: Tensor

    def decode(self) -> Tensor:
        return self.value

    def nbits(self) -> BitCount:
        return BitCount()

    def dense_bits(self) -> int:
        return 0


@dataclass(frozen=True)
class Payload(Mapping[str, Entry]):
    """One message: named encoded entries. Its size is the sum of its entries' sizes."""

    entries: Mapping[str, Entry] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Entry:
        return self.entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def nbits(self) -> BitCount:
        # counted once per payload (its entries are immutable): a downlink shared by a round's
        # clients is charged to each of them without being counted again
        cached: BitCount | None = self.__dict__.get("_nbits")
        if cached is None:
            cached = BitCount()
            for entry in self.entries.values():
                cached = cached + entry.nbits()
            object.__setattr__(self, "_nbits", cached)
        return cached

    def dense_bits(self) -> int:
        """Bits of the same content sent densely (the no-compression reference)."""
        cached: int | None = self.__dict__.get("_dense_bits")
        if cached is None:
            cached = sum(e.dense_bits() for e in self.entries.values())
            object.__setattr__(self, "_dense_bits", cached)
        return cached

    def decode(self) -> dict[str, Tensor]:
        return {k: e.decode() for k, e in self.entries.items()}
