"""The one bit-cost module: hand-worked numbers and the auto-format property."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fedcomm.comm import bits


def test_dense_is_numel_times_value_bits() -> None:
    assert bits.dense(10) == 320  # 10 fp32 values · 32
    assert bits.dense(10, value_bits=8) == 80  # 10 · 8
    assert bits.dense(0) == 0


@pytest.mark.parametrize(
    ("numel", "width"),
    [
        (1, 1),  # one position still needs a (degenerate) 1-bit index
        (2, 1),  # ⌈log2 2⌉ = 1
        (3, 2),  # ⌈log2 3⌉ = 2
        (4, 2),  # ⌈log2 4⌉ = 2
        (5, 3),  # ⌈log2 5⌉ = 3
        (1024, 10),  # 2^10 positions: 0..1023 fit in 10 bits
        (1025, 11),  # one more position needs an 11th bit
        (878_538, 20),  # 2^19 = 524,288 < 878,538 ≤ 2^20
    ],
)
def test_coo_index_width_by_hand(numel: int, width: int) -> None:
    assert bits.coo_index_width(numel) == width


def test_coo_index_width_is_exact_for_huge_numel() -> None:
    # float log2(2^50 + 1) rounds to 50.0; 2^50 + 1 positions need 51 bits.
    assert bits.coo_index_width(2**50) == 50
    assert bits.coo_index_width(2**50 + 1) == 51


@given(numel=st.integers(2, 2**62))
def test_coo_index_width_is_smallest_sufficient(numel: int) -> None:
    w = bits.coo_index_width(numel)
    assert 2**w >= numel > 2 ** (w - 1)  # w bits address numel positions, w - 1 do not


def test_bitmap_is_one_bit_per_position() -> None:
    assert bits.bitmap(1000) == 1000
    assert bits.bitmap(0) == 0


def test_coo_by_hand() -> None:
    assert bits.coo(5, 1024) == 50  # 5 indices · 10 bits
    assert bits.coo(5, 1025) == 55  # 5 indices · 11 bits
    assert bits.coo(0, 1024) == 0
    assert bits.coo(3, 1024, index_bits=64) == 192  # fixed 64-bit positions (FedBIAD): 3 · 64


def test_sparse_index_formats_by_hand() -> None:
    # 10 of 1000 non-zero: bitmap 1000 bits, coo 10 · ⌈log2 1000⌉ = 10 · 10 = 100 bits.
    assert bits.sparse_index(10, 1000, "bitmap") == 1000
    assert bits.sparse_index(10, 1000, "coo") == 100
    assert bits.sparse_index(10, 1000, "auto") == 100
    assert bits.choose_index_format(10, 1000) == "coo"
    # 500 of 1000: coo 5000 bits, bitmap 1000 bits -> bitmap.
    assert bits.sparse_index(500, 1000, "auto") == 1000
    assert bits.choose_index_format(500, 1000) == "bitmap"
    # 100 of 1000: coo 100 · 10 = 1000 = bitmap -> tie goes to the bitmap.
    assert bits.sparse_index(100, 1000, "auto") == 1000
    assert bits.choose_index_format(100, 1000) == "bitmap"


def test_fixed_64_bit_indices() -> None:
    # 10 of 1000 with 64-bit positions: coo 10 · 64 = 640 < bitmap 1000 -> coo.
    assert bits.sparse_index(10, 1000, "coo", index_bits=64) == 640
    assert bits.sparse_index(10, 1000, "auto", index_bits=64) == 640
    # 20 of 1000: coo 20 · 64 = 1280 > bitmap 1000 -> auto takes the bitmap.
    assert bits.sparse_index(20, 1000, "auto", index_bits=64) == 1000
    assert bits.choose_index_format(20, 1000, index_bits=64) == "bitmap"


def test_mask_and_meta() -> None:
    assert bits.mask(64) == 64  # one bit per group
    assert bits.meta() == 32  # one fp32 scalar
    assert bits.meta(3) == 96
    assert bits.meta(2, width=64) == 128


def test_unit_conversions() -> None:
    assert bits.to_bytes(8) == 1.0
    assert bits.to_bytes(1) == 0.125  # not rounded
    assert bits.to_gib(8 * 2**30) == 1.0
    assert bits.to_gib(4 * 2**30) == 0.5


@pytest.mark.parametrize(
    "call",
    [
        lambda: bits.dense(-1),
        lambda: bits.dense(3, value_bits=-1),
        lambda: bits.coo_index_width(-1),
        lambda: bits.bitmap(-1),
        lambda: bits.coo(-1, 10),
        lambda: bits.coo(1, -10),
        lambda: bits.sparse_index(-1, 10, "coo"),
        lambda: bits.sparse_index(1, -10, "auto"),
        lambda: bits.mask(-1),
        lambda: bits.meta(-1),
        lambda: bits.meta(1, width=-32),
    ],
)
def test_negative_counts_raise(call: object) -> None:
    with pytest.raises(ValueError, match=">= 0"):
        call()  # type: ignore[operator]


@given(
    numel=st.integers(1, 10**9),
    frac=st.floats(0, 1),
    index_bits=st.none() | st.integers(1, 64),
)
def test_auto_is_min_of_bitmap_and_coo(numel: int, frac: float, index_bits: int | None) -> None:
    nnz = round(frac * numel)
    auto = bits.sparse_index(nnz, numel, "auto", index_bits)
    bitmap = bits.sparse_index(nnz, numel, "bitmap", index_bits)
    coo = bits.sparse_index(nnz, numel, "coo", index_bits)
    assert auto == min(bitmap, coo)
    chosen = bits.choose_index_format(nnz, numel, index_bits)
    assert bits.sparse_index(nnz, numel, chosen, index_bits) == auto
