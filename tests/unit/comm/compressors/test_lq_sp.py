"""ProgFed's LQ-b (rotated linear stochastic quantisation) and SP-p (seeded random masks):
unbiasedness by Monte Carlo, bits by hand, the rotation's closed form and exact inverse."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from tests.conftest import digits_federation, small_loop, tiny_params

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.comm.codecs import build_compressor, encode_dense
from fedcomm.comm.compressors import _lq
from fedcomm.comm.compressors._entries import LinearQuantized, SeededSparse, bernoulli_mask
from fedcomm.comm.compressors.lq import quantize
from fedcomm.comm.compressors.sp import sparsify
from fedcomm.comm.payload import BitCount, Dense, Free, Mask, Meta, Payload, Sparse
from fedcomm.config import ConfigError, LqCompressor, SpCompressor, validate_params
from fedcomm.simulation import loop

ROTATIONS: list[_lq.Rotation] = ["truncated", "padded", "none"]


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _lq_sd_bound(x: torch.Tensor, bits: int, rotation: _lq.Rotation) -> torch.Tensor:
    """A bound on each decoded value's sd: Ŷ's rounding noise has sd ≤ Δ/2 per entry with
    Δ = (v_max − v_min)/(2^b − 1) ≤ 2R/(2^b − 1), R = max |H·X| (D does not change |Y|), and
    X̂ = H⁻¹(noise ⊙ D) scales it by the norm of the row of H⁻¹ (1 unless truncated)."""
    n1, n2 = _lq.matrix_shape(tuple(x.shape))
    mat = x.reshape(n1, n2).double()
    top = 2**bits - 1
    if rotation == "none":
        return torch.full(x.shape, float(mat.max() - mat.min()) / 2 / top, dtype=torch.float64)
    if rotation == "padded":
        r = float(_lq.rotate(mat, "padded", 0).abs().max())
        return torch.full(x.shape, r / top, dtype=torch.float64)
    r = float(_lq.truncated_apply(mat).abs().max())
    rows = torch.linalg.vector_norm(_lq.truncated_solve(torch.eye(n1, dtype=torch.float64)), dim=1)
    return (rows[:, None] * r / top).expand(n1, n2).reshape(x.shape)


def _assert_unbiased(draws: torch.Tensor, x: torch.Tensor, sd: torch.Tensor) -> None:
    """The mean of ``draws`` (M, *x.shape) is ``x`` within 5 standard errors per value."""
    mean = draws.double().mean(0)
    tol = 5 * sd / math.sqrt(draws.shape[0]) + 1e-6
    err = (mean - x.double()).abs()
    assert bool((err <= tol).all()), float((err / tol).max())


# --- LQ ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("rotation", ROTATIONS)
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("shape", [(10, 7), (13,)])
def test_lq_is_unbiased(shape: tuple[int, ...], bits: int, rotation: _lq.Rotation) -> None:
    x = torch.randn(shape, generator=_gen(1))
    g = _gen(2)
    draws = torch.stack([quantize(x, bits, rotation, g).decode() for _ in range(2000)])
    assert draws.dtype == torch.float32 and draws.shape[1:] == shape
    _assert_unbiased(draws, x, _lq_sd_bound(x, bits, rotation))


@pytest.mark.parametrize("bits", [1, 2, 8])
def test_stochastic_rounding_is_unbiased_to_high_precision(bits: int) -> None:
    # 10⁵ copies of each of u = 0.3, 1.5, top − 0.01 between the end points 0 and top
    top = 2**bits - 1
    us = torch.tensor([0.3, min(1.5, top - 0.5), top - 0.01], dtype=torch.float64)
    y = torch.cat([torch.tensor([0.0, float(top)], dtype=torch.float64), us.repeat(100_000)])
    q, v_min, v_max = _lq.quantize_levels(y, bits, _gen(21))
    assert (float(v_min), float(v_max)) == (0.0, float(top))
    mean = q[2:].double().reshape(100_000, 3).mean(0)
    torch.testing.assert_close(mean, us.float().double(), rtol=0, atol=5 * 0.5 / 100_000**0.5)


@pytest.mark.parametrize("rotation", ROTATIONS)
def test_lq_relative_mse_falls_with_more_bits(rotation: _lq.Rotation) -> None:
    x = torch.randn(48, 20, generator=_gen(3))
    g = _gen(4)

    def rel_mse(bits: int) -> float:
        errs = [
            float(((quantize(x, bits, rotation, g).decode() - x) ** 2).sum()) for _ in range(20)
        ]
        return sum(errs) / len(errs) / float((x**2).sum())

    mse = [rel_mse(b) for b in (2, 4, 8)]
    assert mse[0] > 8 * mse[1] > 64 * mse[2] > 0  # ~16x per 2 bits


@pytest.mark.parametrize("rotation", ROTATIONS)
@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_lq_levels_are_uint8_on_the_grid(bits: int, rotation: _lq.Rotation) -> None:
    x = torch.randn(37, 3, generator=_gen(5))
    e = quantize(x, bits, rotation, _gen(6))
    top = 2**bits - 1
    assert e.levels.dtype == torch.uint8
    assert int(e.levels.min()) == 0 and int(e.levels.max()) == top  # min -> 0, max -> 2^b - 1
    assert e.levels.shape == ((64 if rotation == "padded" else 37), 3)
    y = _lq.rotate(x.double(), rotation, e.seed).float()
    assert float(e.v_min) == float(y.min()) and float(e.v_max) == float(y.max())
    u = (y.double() - float(e.v_min)) / (float(e.v_max) - float(e.v_min)) * top
    assert bool(((e.levels.double() - u).abs() < 1).all())  # one of the two neighbours


def test_lq_closed_form_on_a_hand_example() -> None:
    # n1 = 3: H4 truncated to [[1,1,1],[1,-1,1],[1,1,-1]], whose inverse is
    # [[0,1,1],[1,-1,0],[1,0,-1]] / 2 (x2 = (z1 - z2)/2, x3 = (z1 - z3)/2, x1 = (z2 + z3)/2)
    h = torch.tensor([[1.0, 1, 1], [1, -1, 1], [1, 1, -1]], dtype=torch.float64)
    h_inv = torch.tensor([[0.0, 1, 1], [1, -1, 0], [1, 0, -1]], dtype=torch.float64) / 2
    assert torch.equal(_lq.truncated_hadamard(3), h)
    assert torch.equal(_lq.truncated_solve(torch.eye(3, dtype=torch.float64)), h_inv)
    x = torch.tensor([[0.5, -1.0], [2.0, 0.25], [-0.75, 1.5]])
    e = quantize(x, 8, "truncated", _gen(7))
    assert e.seed is not None and e.rotation == "truncated"
    d = torch.where(_lq.sign_flips(e.seed, (3, 2)), 1.0, -1.0).double()
    y = (h @ x.double()) * d  # Y = (H·X) ⊙ D
    assert float(e.v_min) == float(y.min()) and float(e.v_max) == float(y.max())
    y_hat = e.levels.double() * (float(e.v_max) - float(e.v_min)) / 255 + float(e.v_min)
    assert float((y_hat - y).abs().max()) <= (float(e.v_max) - float(e.v_min)) / 255
    torch.testing.assert_close(e.decode().double(), h_inv @ (y_hat * d), rtol=0, atol=1e-6)


@pytest.mark.parametrize("rotation", ["padded", "none"])
def test_lq_closed_form_of_the_other_rotations(rotation: _lq.Rotation) -> None:
    x = torch.tensor([1.0, -2.0, 0.5])  # 1-D: n1 = 3, padded to 4 rows
    e = quantize(x, 4, rotation, _gen(8))
    y_hat = e.levels.double() * (float(e.v_max) - float(e.v_min)) / 15 + float(e.v_min)
    if rotation == "none":
        assert e.seed is None and e.levels.shape == (3, 1)
        torch.testing.assert_close(e.decode().double(), y_hat[:, 0], rtol=0, atol=1e-6)
        return
    h4 = _lq.truncated_hadamard(4) / 2  # orthonormal, its own inverse
    assert e.seed is not None
    d = torch.where(_lq.sign_flips(e.seed, (4, 1)), 1.0, -1.0).double()
    y = (h4 @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]], dtype=torch.float64)) * d
    assert float(e.v_min) == pytest.approx(float(y.min())) and e.levels.shape == (4, 1)
    torch.testing.assert_close(e.decode().double(), (h4 @ (y_hat * d))[:3, 0], rtol=0, atol=1e-6)


def test_truncated_hadamard_inverse_is_exact() -> None:
    for n1 in range(1, 301):
        h = _lq.truncated_hadamard(n1)
        i = torch.arange(n1)
        bits_and = i[:, None] & i[None, :]
        parity = torch.zeros_like(bits_and)
        while bool(bits_and.any()):
            parity ^= bits_and & 1
            bits_and >>= 1
        assert torch.equal(h, (1 - 2 * parity).double()), n1  # Sylvester: (-1)^popcount(i & j)
        h_inv = _lq.truncated_solve(torch.eye(n1, dtype=torch.float64))
        torch.testing.assert_close(
            h_inv @ h, torch.eye(n1, dtype=torch.float64), rtol=0, atol=1e-12
        )
        if n1 & (n1 - 1) == 0:
            assert torch.equal(h_inv, h / n1)
    h = _lq.truncated_hadamard(300)
    torch.testing.assert_close(
        _lq.truncated_solve(torch.eye(300, dtype=torch.float64)), torch.linalg.inv(h)
    )
    assert float(torch.linalg.cond(_lq.truncated_hadamard(537))) == pytest.approx(32.0)


@pytest.mark.parametrize("rotation", ROTATIONS)
def test_lq_round_trips_large_and_awkward_shapes(rotation: _lq.Rotation) -> None:
    # n1 = 5000 > 4096 (not a power of two) and a conv-like 4-D tensor: no dense H anywhere
    for x in (torch.randn(5000, generator=_gen(9)), torch.randn(24, 3, 3, 3, generator=_gen(9))):
        rel = float(((quantize(x, 8, rotation, _gen()).decode() - x) ** 2).mean() / (x**2).mean())
        assert rel < (2e-3 if rotation == "truncated" else 2e-4)


@pytest.mark.parametrize("rotation", ROTATIONS)
def test_lq_constant_and_zero_tensors_decode_exactly(rotation: _lq.Rotation) -> None:
    zeros = torch.zeros(6, 5)
    assert torch.equal(quantize(zeros, 2, rotation, _gen()).decode(), zeros)
    scalar = torch.tensor(-0.3)  # 1 × 1: Y = ±X is constant
    assert torch.equal(quantize(scalar, 2, rotation, _gen()).decode(), scalar)
    const = torch.full((4, 3), 3.7)
    assert torch.equal(quantize(const, 2, "none", _gen()).decode(), const)
    empty = quantize(torch.zeros(0, 3), 4, rotation, _gen())
    assert empty.decode().shape == (0, 3) and empty.nbits() == BitCount(meta=64)


def test_lq_bits_by_hand() -> None:
    payload = encode_dense({"w": torch.randn(10, 7, generator=_gen()), "b": torch.randn(13)})

    def nbits(**options: Any) -> tuple[BitCount, BitCount]:
        out = build_compressor("lq", **options).encode(payload, None, _gen(), 1)[0]
        assert out.dense_bits() == 32 * 83
        return out["w"].nbits(), out["b"].nbits()

    # LQ-2 of (10, 7): 140 + 2·32 (v_min, v_max) + 32 (the seed of D); (13,): 26 + 96
    assert nbits(bits=2) == (BitCount(payload=140, meta=96), BitCount(payload=26, meta=96))
    assert nbits(bits=8, rotation="none") == (
        BitCount(payload=560, meta=64),
        BitCount(payload=104, meta=64),
    )
    # padded: 16 × 7 and 16 × 1 entries are sent
    assert nbits(bits=4, rotation="padded") == (
        BitCount(payload=448, meta=96),
        BitCount(payload=64, meta=96),
    )


# --- SP ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("keep", [0.25, 0.1])
def test_sp_is_unbiased(keep: float) -> None:
    x = torch.randn(10, 7, generator=_gen(10))
    g = _gen(11)
    draws = torch.stack([sparsify(x, keep, None, "truncated", g).decode() for _ in range(4000)])
    sd = x.double().abs() * math.sqrt(1 / keep - 1)  # x/p with probability p, else 0
    _assert_unbiased(draws, x, sd)
    kept_sd = torch.full(x.shape, math.sqrt(keep * (1 - keep)), dtype=torch.float64)
    _assert_unbiased((draws != 0).double(), torch.full(x.shape, keep), kept_sd)  # P(kept) = p


@pytest.mark.parametrize("rotation", ROTATIONS)
def test_lq8_sp_is_unbiased(rotation: _lq.Rotation) -> None:
    x = torch.randn(10, 7, generator=_gen(12))
    g = _gen(13)
    draws = torch.stack([sparsify(x, 0.25, 8, rotation, g).decode() for _ in range(4000)])
    _assert_unbiased(draws, x, draws.double().std(0))  # CLT with the sample sd


def test_sp_sends_the_seed_and_the_kept_values() -> None:
    x = torch.randn(40, 3, generator=_gen(14))
    e = sparsify(x, 0.25, None, "truncated", _gen(15))
    mask = bernoulli_mask(e.seed, 0.25, 120)
    assert isinstance(e.values, Dense) and e.values.values.dtype == torch.float32
    assert torch.equal(e.values.values, x.reshape(-1)[mask] / 0.25)
    assert torch.equal(e.decode(), torch.where(mask.reshape(40, 3), x / 0.25, 0.0))
    q = sparsify(x, 0.25, 2, "truncated", _gen(15))
    assert q.seed == e.seed and isinstance(q.values, LinearQuantized)
    assert q.values.shape == (int(mask.sum()),) and q.values.bits == 2
    assert bool((q.decode().reshape(-1)[~mask] == 0).all())


def test_sp_bits_by_hand() -> None:
    x = torch.randn(10, 7, generator=_gen(16))

    def entry(**options: Any) -> SeededSparse:
        out = build_compressor("sp", **options).encode(encode_dense({"w": x}), None, _gen(17), 1)
        e = out[0]["w"]
        assert isinstance(e, SeededSparse) and e.dense_bits() == 70 * 32
        return e

    e = entry(keep=0.25)
    nnz = int(bernoulli_mask(e.seed, 0.25, 70).sum())
    assert 0 < nnz < 70
    assert e.nbits() == BitCount(payload=nnz * 32, meta=32)  # values + the mask's seed
    assert entry(keep=0.25, bits=8).nbits() == BitCount(payload=nnz * 8, meta=64 + 32 + 32)
    assert entry(keep=0.25, bits=8, rotation="none").nbits() == BitCount(
        payload=nnz * 8, meta=64 + 32
    )
    padded = 1 << (nnz - 1).bit_length()
    assert entry(keep=0.25, bits=4, rotation="padded").nbits() == BitCount(
        payload=padded * 4, meta=128
    )
    assert entry(keep=1.0).nbits() == BitCount(payload=70 * 32, meta=32)


def test_sp_empty_mask_costs_only_the_seed() -> None:
    x = torch.ones(3)
    g = _gen(18)
    for _ in range(200):  # P(nothing kept) = 0.9³ ≈ 0.73 per draw
        e = sparsify(x, 0.1, 8, "truncated", g)
        if e.values.decode().numel() == 0:
            break
    assert e.nbits() == BitCount(meta=32) and torch.equal(e.decode(), torch.zeros(3))


# --- both: determinism, pass-through, the factories and the configs -----------------------------

OPTIONS: list[tuple[str, dict[str, Any]]] = [
    ("lq", {"bits": 2}),
    ("lq", {"bits": 4, "rotation": "padded"}),
    ("lq", {"rotation": "none"}),
    ("sp", {"keep": 0.25}),
    ("sp", {"keep": 0.1, "bits": 8}),
    ("sp", {"keep": 0.5, "bits": 2, "rotation": "padded"}),
]
IDS = [f"{n}-{'-'.join(map(str, o.values()))}" for n, o in OPTIONS]


@pytest.mark.parametrize(("name", "options"), OPTIONS, ids=IDS)
def test_same_seed_same_message_and_non_updates_pass_through(
    name: str, options: dict[str, Any]
) -> None:
    others = {
        "mask": Mask(torch.tensor([True, False, True])),
        "meta": Meta(torch.tensor([0.5])),
        "free": Free(torch.tensor([1.0, 0.0])),
        "sparse": Sparse(torch.tensor([2.0]), torch.tensor([1]), (3,)),
        "ints": Dense(torch.tensor([1, 2, 3])),
    }
    x = torch.randn(20, 6, generator=_gen(19))
    payload = Payload({"w": Dense(x), **others, "b": Dense(torch.randn(5, generator=_gen(20)))})
    comp = build_compressor(name, **options)
    a, b, c = (comp.encode(payload, comp.init(), _gen(s), 1)[0] for s in (0, 0, 1))
    assert list(a) == list(payload) and all(a[k] is e for k, e in others.items())
    assert a.nbits() == b.nbits() and torch.equal(a["w"].decode(), b["w"].decode())
    assert torch.equal(a["b"].decode(), b["b"].decode())
    assert not torch.equal(a["w"].decode(), c["w"].decode())


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("lq", {"bits": 0}, "bits must be in 1..8"),
        ("lq", {"bits": 9}, "bits must be in 1..8"),
        ("lq", {"rotation": "hadamard"}, "rotation must be one of"),
        ("sp", {"keep": 0.0}, "keep must be in"),
        ("sp", {"keep": 1.5}, "keep must be in"),
        ("sp", {"bits": 9}, "bits must be in 1..8"),
        ("sp", {"bits": 8, "rotation": "x"}, "rotation must be one of"),
    ],
)
def test_factories_reject_bad_options(name: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_compressor(name, **options)


@pytest.mark.parametrize(
    ("compressor", "fragment"),
    [
        ({"name": "lq", "bits": 0}, "train.compressor.bits: Input should be greater than or equal"),
        ({"name": "lq", "bits": 9}, "train.compressor.bits: Input should be less than or equal"),
        ({"name": "lq", "rotation": "hadamard"}, "train.compressor.rotation"),
        ({"name": "sp", "keep": 0}, "train.compressor.keep: Input should be greater than 0"),
        ({"name": "sp", "keep": 1.2}, "train.compressor.keep"),
        ({"name": "sp", "bits": 9}, "train.compressor.bits"),
        ({"name": "sp", "levels": 8}, "train.compressor.levels: Extra inputs"),
    ],
)
def test_bad_lq_sp_configs_are_named(compressor: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_params(tiny_params(**{"train.compressor": compressor}))
    assert fragment in str(info.value)


def test_lq_sp_configs_validate_and_build() -> None:
    assert LqCompressor().model_dump() == {"name": "lq", "bits": 8, "rotation": "truncated"}
    assert SpCompressor().model_dump() == {
        "name": "sp",
        "keep": 0.1,
        "bits": None,
        "rotation": "truncated",
    }
    for raw in ({"name": "lq", "bits": 2}, {"name": "sp", "keep": 0.1, "bits": 8}):
        cfg = validate_params(tiny_params(**{"train.compressor": raw})).train.compressor
        assert build_compressor(cfg.name, **cfg.model_dump(exclude={"name"})).name == raw["name"]


def test_loop_ledger_follows_the_lq_rule() -> None:
    fed = digits_federation(6)
    model, cfg = small_loop(fed, checkpoint_every=1)
    alg = build_algorithm(CONFIGS["fedavg"](server={"optimizer": "sgd", "lr": 1.0}))
    res = loop.run(cfg, alg, model, fed, build_compressor("lq", bits=4), config_hash="c")
    shapes = [tuple(p.shape) for p in model.parameters()]
    up = [r for r in res.ledger.rows if r[2] == "up"]
    assert len(up) == 6
    for _, _, _, payload_bits, index_bits, meta_bits, *_ in up:
        assert payload_bits == sum(4 * math.prod(s) for s in shapes) and index_bits == 0
        assert meta_bits == 96 * len(shapes)
