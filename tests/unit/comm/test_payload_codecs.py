"""Payload entries and codecs: exact round-trips and sizes counted through ``comm.bits``."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcomm.comm import bits
from fedcomm.comm.codecs import (
    COMPRESSORS,
    build_compressor,
    encode_auto,
    encode_dense,
    encode_sparse,
    encode_sparse_tensor,
    register_compressor,
)
from fedcomm.comm.payload import BitCount, Dense, Free, Mask, Meta, Payload, Sparse


def _sparse_tensor(shape: tuple[int, ...], density: float, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=g)
    keep = torch.rand(shape, generator=g) < density
    return values * keep


# --- round-trips --------------------------------------------------------------------------------


def test_dense_round_trip() -> None:
    tensors = {"w": torch.randn(3, 4), "b": torch.randn(4)}
    decoded = encode_dense(tensors).decode()
    assert decoded.keys() == tensors.keys()
    for k, v in tensors.items():
        assert torch.equal(decoded[k], v)


@pytest.mark.parametrize("fmt", ["bitmap", "coo", "auto"])
def test_sparse_round_trip(fmt: str) -> None:
    t = torch.tensor([[0.0, 1.5, 0.0], [-2.0, 0.0, 3.25]])
    entry = encode_sparse_tensor(t, fmt)  # type: ignore[arg-type]
    assert entry.positions.tolist() == [1, 3, 5]  # flat, ascending
    assert entry.values.tolist() == [1.5, -2.0, 3.25]
    assert entry.shape == (2, 3)
    assert torch.equal(entry.decode(), t)
    assert torch.equal(encode_sparse({"t": t}, fmt).decode()["t"], t)  # type: ignore[arg-type]


shapes = st.lists(st.integers(1, 9), min_size=0, max_size=3).map(tuple)


@settings(max_examples=60, deadline=None)
@given(
    shape=shapes,
    density=st.sampled_from([0.0, 0.01, 0.1, 0.5, 0.9, 1.0]),
    seed=st.integers(0, 2**31 - 1),
    fmt=st.sampled_from(["auto", "bitmap", "coo"]),
)
def test_random_sparse_round_trip(
    shape: tuple[int, ...], density: float, seed: int, fmt: str
) -> None:
    t = _sparse_tensor(shape, density, seed)
    entry = encode_sparse_tensor(t, fmt)  # type: ignore[arg-type]
    assert torch.equal(entry.decode(), t)
    assert entry.decode().shape == t.shape
    assert entry.values.numel() == int(torch.count_nonzero(t))
    assert entry.fmt in ("bitmap", "coo")  # auto is resolved to what is actually sent
    if fmt != "auto":
        assert entry.fmt == fmt
    auto = encode_auto({"t": t})
    assert torch.equal(auto.decode()["t"], t)
    assert auto.nbits().total <= encode_dense({"t": t}).nbits().total


def test_all_zero_and_all_nonzero() -> None:
    zeros = torch.zeros(4, 5)
    entry = encode_sparse_tensor(zeros)
    assert entry.values.numel() == 0
    assert torch.equal(entry.decode(), zeros)
    assert entry.nbits() == BitCount(payload=0, index=0)  # coo of 0 indices beats a 20-bit bitmap

    full = torch.arange(1.0, 21.0).reshape(4, 5)
    entry = encode_sparse_tensor(full)
    assert torch.equal(entry.decode(), full)
    # 20 values · 32 + min(bitmap 20, coo 20 · ⌈log2 20⌉ = 100) = 640 + 20
    assert entry.fmt == "bitmap"
    assert entry.nbits() == BitCount(payload=640, index=20)


# --- sizes of each entry kind, by hand ----------------------------------------------------------


def test_dense_nbits() -> None:
    entry = Dense(torch.zeros(3, 4))
    assert entry.nbits() == BitCount(payload=384)  # 12 · 32
    assert entry.dense_bits() == 384
    half = Dense(torch.zeros(3, 4), value_bits=16)
    assert half.nbits().total == 192  # 12 · 16
    assert half.dense_bits() == 384  # the reference is always fp32


def test_sparse_nbits_by_hand() -> None:
    # 3 non-zeros in a (10, 100) tensor: values 3 · 32 = 96; coo 3 · ⌈log2 1000⌉ = 30; bitmap 1000.
    t = torch.zeros(10, 100)
    t[0, 1], t[5, 7], t[9, 99] = 1.0, 2.0, 3.0
    assert encode_sparse_tensor(t, "coo").nbits() == BitCount(payload=96, index=30)
    assert encode_sparse_tensor(t, "bitmap").nbits() == BitCount(payload=96, index=1000)
    assert encode_sparse_tensor(t, "auto").nbits() == BitCount(payload=96, index=30)
    assert encode_sparse_tensor(t, "auto").fmt == "coo"
    assert encode_sparse_tensor(t, "coo", index_bits=64).nbits() == BitCount(96, 192)  # 3 · 64
    assert encode_sparse_tensor(t).dense_bits() == 32_000  # 1000 · 32


@settings(max_examples=40, deadline=None)
@given(
    numel=st.integers(1, 2000),
    nnz_frac=st.floats(0, 1),
    fmt=st.sampled_from(["auto", "bitmap", "coo"]),
    index_bits=st.none() | st.integers(1, 64),
)
def test_sparse_counting_matches_bits(
    numel: int, nnz_frac: float, fmt: str, index_bits: int | None
) -> None:
    nnz = round(nnz_frac * numel)
    entry = Sparse(
        values=torch.ones(nnz),
        positions=torch.arange(nnz),
        shape=(numel,),
        fmt=fmt,  # type: ignore[arg-type]
        index_bits=index_bits,
    )
    expected = BitCount(
        payload=bits.dense(nnz),
        index=bits.sparse_index(nnz, numel, fmt, index_bits),  # type: ignore[arg-type]
    )
    assert entry.nbits() == expected
    assert entry.dense_bits() == bits.dense(numel)


def test_mask_is_one_bit_per_element() -> None:
    m = torch.tensor([True, False, True, True, False])
    entry = Mask(m)
    assert entry.nbits() == BitCount(payload=5)
    assert entry.dense_bits() == 5
    assert torch.equal(entry.decode(), m)


def test_meta_costs_its_width() -> None:
    assert Meta(torch.tensor(0.5)).nbits() == BitCount(meta=32)
    assert Meta(torch.tensor([1, 2, 3]), width=64).nbits() == BitCount(meta=192)  # 3 · 64


def test_free_costs_nothing() -> None:
    v = torch.randn(100)
    entry = Free(v)
    assert entry.nbits() == BitCount()
    assert entry.nbits().total == 0
    assert entry.dense_bits() == 0
    assert torch.equal(entry.decode(), v)


def test_bitcount_sum() -> None:
    total = BitCount(1, 2, 3) + BitCount(10, 20, 30)
    assert total == BitCount(11, 22, 33)
    assert total.total == 66


def test_payload_sums_its_entries() -> None:
    sparse = encode_sparse_tensor(torch.tensor([0.0, 0.0, 4.0, 0.0]))  # 32 + min(4, 1 · 2) = 2
    payload = Payload(
        {
            "w": Dense(torch.zeros(2, 5)),  # 10 · 32 = 320
            "s": sparse,  # payload 32, index 2
            "m": Mask(torch.ones(7, dtype=torch.bool)),  # 7
            "scale": Meta(torch.tensor(1.0)),  # meta 32
            "seeded": Free(torch.zeros(1000)),  # 0
        }
    )
    assert payload.nbits() == BitCount(payload=320 + 32 + 7, index=2, meta=32)
    assert payload.nbits().total == 393
    # dense reference: 320 + 4 · 32 + 7 + 32 + 0
    assert payload.dense_bits() == 487
    assert len(payload) == 5
    assert list(payload) == ["w", "s", "m", "scale", "seeded"]
    assert Payload().nbits() == BitCount()


# --- codecs -------------------------------------------------------------------------------------


def test_encode_dense_bits_equal_dense_reference() -> None:
    payload = encode_dense({"a": torch.zeros(7), "b": torch.zeros(2, 3)})
    assert payload.nbits() == BitCount(payload=13 * 32)
    assert payload.dense_bits() == 13 * 32


def test_encode_auto_picks_the_smaller_per_tensor() -> None:
    sparse_t = torch.zeros(1000)
    sparse_t[[3, 500]] = 1.0  # 2 · 32 + 2 · 10 = 84 < 32,000
    dense_t = torch.randn(10)  # sparse: 320 + 10 > 320 dense
    payload = encode_auto({"s": sparse_t, "d": dense_t})
    assert isinstance(payload["s"], Sparse)
    assert isinstance(payload["d"], Dense)
    assert payload.nbits().total == 84 + 320


@settings(max_examples=40, deadline=None)
@given(
    numel=st.integers(1, 500),
    density=st.floats(0, 1),
    seed=st.integers(0, 2**31 - 1),
)
def test_encode_auto_never_larger_than_dense(numel: int, density: float, seed: int) -> None:
    t = _sparse_tensor((numel,), density, seed)
    auto = encode_auto({"t": t}).nbits().total
    dense = encode_dense({"t": t}).nbits().total
    sparse = encode_sparse({"t": t}).nbits().total
    assert auto == min(dense, sparse)


def test_identity_compressor_is_a_no_op() -> None:
    comp = build_compressor("none")
    state = comp.init()
    payload = encode_dense({"w": torch.randn(4, 4), "b": torch.randn(4)})
    out, new_state = comp.encode(payload, state, torch.Generator().manual_seed(0), 1)
    assert out.keys() == payload.keys()
    for k in payload:
        assert torch.equal(out[k].decode(), payload[k].decode())
    assert new_state == state
    # STYLE rule 12: the identity compressor's sent bits equal the dense bits.
    assert out.nbits().total == payload.dense_bits() == 20 * 32


def test_unknown_compressor() -> None:
    with pytest.raises(ValueError, match=r"unknown compressor 'nope'.*'none'"):
        build_compressor("nope")


def test_register_compressor_twice_is_an_error() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        register_compressor("none")(lambda: build_compressor("none"))
    assert "none" in COMPRESSORS


def test_dense_counts_the_dtype_width_unless_told() -> None:
    from fedcomm.comm.payload import Dense

    assert Dense(torch.zeros(10)).nbits().payload == 320  # fp32
    assert Dense(torch.zeros(10, dtype=torch.float16)).nbits().payload == 160
    assert Dense(torch.zeros(10, dtype=torch.float64)).nbits().payload == 640
    assert Dense(torch.zeros(10, dtype=torch.int8)).nbits().payload == 80
    assert Dense(torch.zeros(10, dtype=torch.float64), value_bits=32).nbits().payload == 320
