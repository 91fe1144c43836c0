"""DGC and STC: exact k, residual conservation, warm-up, ternary values, bits by hand."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcomm.comm.codecs import build_compressor, encode_dense
from fedcomm.comm.compressors._common import keep_count
from fedcomm.comm.compressors._entries import Ternary
from fedcomm.comm.compressors.dgc import warmup_density
from fedcomm.comm.payload import Payload, Sparse


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize(
    ("density", "numel", "k"),
    [(0.1, 30, 3), (0.001, 1000, 1), (0.001, 1001, 2), (1 / 400, 400, 1), (0.25, 10, 3),
     (1.0, 7, 7), (0.001, 1, 1), (0.5, 0, 0)],
)  # fmt: skip
def test_keep_count_is_the_exact_ceiling(density: float, numel: int, k: int) -> None:
    assert keep_count(density, numel) == k  # 0.1·30 is 3 (a float product would give 4)


@settings(max_examples=40, deadline=None)
@given(
    numel=st.integers(1, 3000),
    density=st.floats(1e-4, 1.0),
    seed=st.integers(0, 2**16),
)
def test_dgc_keeps_k_and_conserves_the_update_exactly(
    numel: int, density: float, seed: int
) -> None:
    comp = build_compressor("dgc", density=density, warmup_rounds=0)
    g = _gen(seed)
    state = comp.init()
    for round_ in (1, 2, 3):
        delta = torch.randn(numel, generator=g)  # no exact zeros
        before = state.get("w", torch.zeros(numel))
        out, state = comp.encode(encode_dense({"w": delta}), state, g, round_)
        entry = out["w"]
        assert isinstance(entry, Sparse) and entry.fmt == "coo"
        assert entry.values.numel() == keep_count(density, numel)
        assert torch.equal(entry.decode() + state["w"], before + delta)  # sent + r' == r + Δ
        unsent = (before + delta).abs()[state["w"] != 0]  # top-k: nothing left is larger
        assert unsent.numel() == 0 or unsent.max() <= entry.values.abs().min()


def test_dgc_warmup_densities_per_round() -> None:
    # 0.25**r while r <= warmup_rounds, never below the target: 75/93.75/98.4375/99.6/99.9 %
    dens = [warmup_density(0.001, 4, r) for r in range(1, 7)]
    assert dens == [0.25, 0.0625, 0.015625, 0.00390625, 0.001, 0.001]
    assert warmup_density(0.01, 4, 4) == 0.01  # a target denser than the warm-up wins
    comp = build_compressor("dgc")  # defaults: density 0.001, 4 warm-up rounds
    state = comp.init()
    ks = []
    for round_ in range(1, 7):
        out, state = comp.encode(encode_dense({"w": torch.randn(4096)}), state, _gen(), round_)
        ks.append(out["w"].values.numel())  # type: ignore[attr-defined]
    assert ks == [1024, 256, 64, 16, 5, 5]  # ceil(4096·d): 0.001·4096 = 4.096 -> 5


def test_dgc_bits_by_hand() -> None:
    # w: 10 values, b: 3 values, density 0.2 -> k = ceil(2.0) = 2 and ceil(0.6) = 1
    # bits = (2 + 1)·(32 value + 64 position) = 288
    comp = build_compressor("dgc", density=0.2, warmup_rounds=0)
    payload = encode_dense({"w": torch.randn(2, 5, generator=_gen()), "b": torch.ones(3)})
    out, _ = comp.encode(payload, comp.init(), _gen(), 1)
    n = out.nbits()
    assert (n.payload, n.index, n.meta) == (3 * 32, 3 * 64, 0)
    assert out.nbits().total == 288
    assert out.dense_bits() == payload.dense_bits() == 13 * 32
    assert out["w"].decode().shape == (2, 5)


def test_stc_hand_example() -> None:
    delta = torch.tensor([0.5, -2.0, 0.1, 3.0, -1.0, 0.0, 0.2, -0.3])
    comp = build_compressor("stc", density=0.25)  # k = ceil(0.25·8) = 2: positions 3 and 1
    out, state = comp.encode(encode_dense({"w": delta}), comp.init(), _gen(), 1)
    entry = out["w"]
    assert isinstance(entry, Ternary)
    assert float(entry.mu) == 2.5  # mean(|3.0|, |-2.0|)
    assert entry.decode().tolist() == [0, -2.5, 0, 2.5, 0, 0, 0, 0]
    assert state["w"].tolist() == pytest.approx([0.5, 0.5, 0.1, 0.5, -1.0, 0.0, 0.2, -0.3])
    # bits: k·(1 sign + 64 position) + 32 (mu) = 2·65 + 32 = 162
    n = entry.nbits()
    assert (n.payload, n.index, n.meta, n.total) == (2, 128, 32, 162)


@settings(max_examples=30, deadline=None)
@given(numel=st.integers(1, 2000), density=st.floats(1e-3, 1.0), seed=st.integers(0, 2**16))
def test_stc_is_ternary_with_mean_magnitude_and_conserves(
    numel: int, density: float, seed: int
) -> None:
    comp = build_compressor("stc", density=density)
    g = _gen(seed)
    state = comp.init()
    for round_ in (1, 2):
        delta = torch.randn(numel, generator=g)
        a = state.get("w", torch.zeros(numel)) + delta
        out, state = comp.encode(encode_dense({"w": delta}), state, g, round_)
        entry = out["w"]
        assert isinstance(entry, Ternary)
        k = keep_count(density, numel)
        assert entry.positions.numel() == k
        mu = a[entry.positions].abs().mean()
        assert torch.allclose(entry.mu, mu)
        sent = entry.decode()
        assert set(sent.unique().tolist()) <= {-float(entry.mu), 0.0, float(entry.mu)}
        assert torch.equal(torch.sign(sent[entry.positions]), torch.sign(a[entry.positions]))
        # a − T is rounded once in fp32: conservation holds to an ulp, not bit for bit
        torch.testing.assert_close(sent + state["w"], a, rtol=0, atol=1e-6)
        assert entry.nbits().total == k * 65 + 32


def test_residual_state_is_new_and_per_entry() -> None:
    comp = build_compressor("dgc", density=0.5, warmup_rounds=0)
    s0 = comp.init()
    p = encode_dense({"w": torch.tensor([1.0, -3.0]), "b": torch.tensor([2.0, 0.5])})
    _, s1 = comp.encode(p, s0, _gen(), 1)
    assert s0 == {} and set(s1) == {"w", "b"}
    _, s2 = comp.encode(Payload({"w": p["w"]}), s1, _gen(), 2)
    assert s1["w"].tolist() == [1.0, 0.0] and s2["w"].tolist() == [2.0, 0.0]  # s1 untouched
    assert s2["b"] is s1["b"]  # an entry absent this round keeps its residual
    _, s3 = comp.encode(encode_dense({"w": torch.ones(3)}), s2, _gen(), 3)
    assert s3["w"].numel() == 3  # a residual of another size is dropped, not misapplied


def test_residuals_follow_coordinates_of_masked_uploads() -> None:
    """Dropout-style uplinks send the kept entries of a parameter as a flat vector with a
    ``keep/<param>`` mask; DGC's residual must stay in full-parameter coordinates."""
    from fedcomm.comm.codecs import build_compressor
    from fedcomm.comm.payload import Dense, Free, Payload

    comp = build_compressor("dgc", density=0.25, warmup_rounds=0, index_bits=64)
    g = torch.Generator().manual_seed(0)
    update = torch.arange(1.0, 9.0)  # full parameter of 8 entries
    m1 = torch.tensor([1, 1, 1, 1, 0, 0, 0, 0], dtype=torch.bool)
    m2 = torch.tensor([0, 0, 1, 1, 1, 1, 0, 0], dtype=torch.bool)
    p1 = Payload({"w/x": Dense(update[m1]), "keep/x": Free(m1)})
    out1, state = comp.encode(p1, comp.init(), g, 1)
    r1 = state["w/x"]
    assert r1.shape == (8,)  # full coordinates
    sent1 = torch.zeros(8)
    sent1[m1] = out1.decode()["w/x"].reshape(-1)
    torch.testing.assert_close(sent1 + r1, torch.where(m1, update, torch.zeros(8)))
    p2 = Payload({"w/x": Dense(update[m2]), "keep/x": Free(m2)})
    out2, state2 = comp.encode(p2, state, g, 2)
    r2 = state2["w/x"]
    sent2 = torch.zeros(8)
    sent2[m2] = out2.decode()["w/x"].reshape(-1)
    expected = r1.clone()
    expected[m2] += update[m2]  # a = r + Δ at the kept coordinates only
    torch.testing.assert_close(sent2 + r2, expected)
    assert torch.equal(r2[~m2], r1[~m2])  # coordinates not sent keep their residual


def test_dgc_model_scope_takes_one_top_k_over_all_entries() -> None:
    # N = 4 + 2 = 6, density 0.5 -> k = 3 over everything: 10 (w), 6 and 5 (b). Per tensor
    # the same update sends ceil(0.5·4) = 2 of w (10, 0.3) and 1 of b (6).
    w = torch.tensor([[10.0, 0.1], [0.2, 0.3]])
    b = torch.tensor([5.0, 6.0])
    payload = encode_dense({"w": w, "b": b})
    model = build_compressor("dgc", density=0.5, warmup_rounds=0, scope="model")
    out, state = model.encode(payload, model.init(), _gen(), 1)
    assert out["w"].positions.tolist() == [0] and out["b"].positions.tolist() == [0, 1]  # type: ignore[attr-defined]
    assert out.nbits().payload == 3 * 32
    for name, full in (("w", w), ("b", b)):  # sent + residual == the update, entry by entry
        torch.testing.assert_close(out[name].decode().reshape(-1) + state[name], full.reshape(-1))
    per_tensor = build_compressor("dgc", density=0.5, warmup_rounds=0)
    out_t, _ = per_tensor.encode(payload, per_tensor.init(), _gen(), 1)
    assert out_t["w"].positions.tolist() == [0, 3] and out_t["b"].positions.tolist() == [1]  # type: ignore[attr-defined]


def test_dgc_dense_vectors_sends_biases_as_they_are() -> None:
    from fedcomm.comm.payload import Dense, Free

    w, b = torch.randn(4, 5, generator=_gen()), torch.randn(4, generator=_gen(1))
    comp = build_compressor("dgc", density=0.1, warmup_rounds=0, vectors="dense")
    out, state = comp.encode(encode_dense({"w": w, "b": b}), comp.init(), _gen(), 1)
    assert isinstance(out["b"], Dense) and torch.equal(out["b"].values, b)
    assert set(state) == {"w"}  # no residual for a vector sent whole
    assert isinstance(out["w"], Sparse) and out["w"].values.numel() == 2
    assert out.nbits().total == 2 * (32 + 64) + 4 * 32
    # a masked entry is flat, but its parameter (the keep/ mask) is 2-D: still compressed
    keep = torch.zeros(4, 5, dtype=torch.bool)
    keep[:2] = True
    masked = Payload({"w/x": Dense(w[keep]), "keep/x": Free(keep)})
    out_m, _ = comp.encode(masked, comp.init(), _gen(), 1)
    assert isinstance(out_m["w/x"], Sparse) and out_m["w/x"].values.numel() == 1


def test_dgc_rejects_unknown_readings() -> None:
    with pytest.raises(ValueError, match="scope must be tensor"):
        build_compressor("dgc", scope="layer")
