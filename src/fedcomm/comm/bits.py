"""The ONLY place where bit costs are defined.

Every payload's size is computed by a function of this module applied to what is actually sent
(values, indices or bitmaps, masks, scales, seeds). Counting rules:

* a dense float tensor costs ``numel * value_bits`` (fp32: 32 bits per value);
* a sparse tensor costs ``nnz * value_bits`` for the values plus the cheaper index structure of
  a bitmap (``numel`` bits) and coordinate indices (``nnz * ceil(log2 numel)`` bits), unless a
  fixed per-index width is asked for (the FedBIAD paper counts 64 bits per position);
* a bit mask (one bit per group, row or entry) costs ``numel`` bits;
* metadata scalars (scales, seeds, counts) cost their declared width (32 bits by default);
* a stochastically quantised value with ``s`` magnitude levels costs a sign bit plus
  ``ceil(log2(s + 1))`` bits for its level in ``{0..s}`` (QSGD/FedPAQ; ``s = 127``: 8 bits);
* a linearly quantised tensor (ProgFed's LQ-b) costs ``b`` bits per quantised entry (with the
  ``padded`` rotation the zero rows added up to a power of two are quantised and counted too)
  plus ``2 × 32`` meta bits for ``v_min``, ``v_max`` and 32 more for the seed of the rotation's
  sign flips when it is rotated: LQ-2 of a rotated ``10 × 7`` tensor costs ``140 + 96``;
* a random mask regenerated from a sent seed (ProgFed's SP-p) costs the seed's 32 meta bits and
  no index; its kept values cost what they are sent as (``nnz · 32`` in fp32, or LQ-b's rule
  above for the flat vector of kept values when ``nnz > 0``).

Bytes are ``bits / 8``; GiB are ``bytes / 2**30``.
"""

from __future__ import annotations

from typing import Literal

FLOAT_BITS = 32  # fp32 values
META_BITS = 32  # a scalar of metadata (scale, seed, count)
GIB = 2**30  # bytes in a GiB

IndexFormat = Literal["auto", "bitmap", "coo"]


def dense(numel: int, value_bits: int = FLOAT_BITS) -> int:
    """Bits of ``numel`` values of ``value_bits`` each."""
    _check_nonneg(numel=numel, value_bits=value_bits)
    return numel * value_bits


def coo_index_width(numel: int) -> int:
    """Bits needed to address one of ``numel`` positions: ``ceil(log2 numel)`` (>= 1)."""
    _check_nonneg(numel=numel)
    # Exact integer form of ceil(log2 numel): float log2 rounds 2**k + 1 down to k for k >= ~48.
    return max(1, (numel - 1).bit_length())


def bitmap(numel: int) -> int:
    """Bits of a presence bitmap over ``numel`` positions."""
    _check_nonneg(numel=numel)
    return numel


def coo(nnz: int, numel: int, index_bits: int | None = None) -> int:
    """Bits of ``nnz`` coordinate indices into ``numel`` positions (fixed width if given)."""
    _check_nonneg(nnz=nnz, numel=numel, index_bits=index_bits or 0)
    if nnz > numel:
        raise ValueError(f"nnz={nnz} exceeds numel={numel}")
    width = coo_index_width(numel) if index_bits is None else index_bits
    return nnz * width


def sparse_index(
    nnz: int, numel: int, fmt: IndexFormat = "auto", index_bits: int | None = None
) -> int:
    """Index bits of a sparse tensor in format ``fmt`` (``auto`` = the cheaper of the two)."""
    _check_nonneg(nnz=nnz, numel=numel)
    if nnz > numel:
        raise ValueError(f"nnz={nnz} exceeds numel={numel}")
    if fmt == "bitmap":
        return bitmap(numel)
    if fmt == "coo":
        return coo(nnz, numel, index_bits)
    return min(bitmap(numel), coo(nnz, numel, index_bits))


def choose_index_format(
    nnz: int, numel: int, index_bits: int | None = None
) -> Literal["bitmap", "coo"]:
    """The cheaper index structure for ``nnz`` of ``numel`` (ties go to the bitmap)."""
    return "bitmap" if bitmap(numel) <= coo(nnz, numel, index_bits) else "coo"


def mask(numel: int) -> int:
    """Bits of a binary mask: one bit per group, row or entry."""
    return bitmap(numel)


def meta(count: int = 1, width: int = META_BITS) -> int:
    """Bits of ``count`` metadata scalars of ``width`` bits."""
    _check_nonneg(count=count, width=width)
    return count * width


def quantized_width(levels: int) -> int:
    """Bits of one signed level with ``levels`` magnitude levels: ``1 + ceil(log2(s + 1))``."""
    if levels < 1:
        raise ValueError(f"levels must be >= 1, got {levels}")
    return 1 + levels.bit_length()  # levels.bit_length() == ceil(log2(levels + 1))


def linear_quantized(numel: int, value_bits: int) -> int:
    """Payload bits of ``numel`` linearly quantised levels of ``value_bits`` each (LQ-b)."""
    if not 1 <= value_bits <= 8:
        raise ValueError(f"value_bits must be in 1..8, got {value_bits}")
    return dense(numel, value_bits)


def linear_quantized_meta(rotated: bool) -> int:
    """Meta bits of an LQ-b tensor: ``v_min``, ``v_max`` and, when rotated, the sign-flip seed."""
    return meta(3 if rotated else 2)


def seeded_mask() -> int:
    """Bits of a random mask the receiver regenerates from a sent seed: the seed (32 bits)."""
    return meta(1)


def to_bytes(bits: int) -> float:
    """Bits to bytes (not rounded: a 1-bit mask is 0.125 byte)."""
    return bits / 8


def to_gib(bits: int) -> float:
    """Bits to GiB (2**30 bytes)."""
    return bits / 8 / GIB


def _check_nonneg(**values: int) -> None:
    for key, value in values.items():
        if value < 0:
            raise ValueError(f"{key} must be >= 0, got {value}")
