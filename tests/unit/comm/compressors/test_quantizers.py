"""SignSGD (majority vote at the server) and FedPAQ (unbiased stochastic quantisation)."""

from __future__ import annotations

import pytest
import torch

from fedcomm.comm import bits
from fedcomm.comm.codecs import build_compressor, encode_dense
from fedcomm.comm.compressors._entries import Quantized, Signs
from fedcomm.comm.compressors.fedpaq import quantize
from fedcomm.comm.payload import Mask, Payload


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _signs(deltas: list[list[float]], scale: bool = False) -> list[Payload]:
    comp = build_compressor("signsgd", scale=scale)
    return [comp.encode(encode_dense({"w": torch.tensor(d)}), None, _gen(), 1)[0] for d in deltas]


DELTAS = [[1.0, -2.0, 0.5, -0.1], [-1.0, -1.0, 0.3, 0.2], [2.0, 3.0, -0.5, 0.4]]


def test_signsgd_majority_vote_by_hand() -> None:
    # signs: [+,-,+,-], [-,-,+,+], [+,+,-,+]; sums [1,-1,1,1] -> vote [1,-1,1,1]
    payloads = _signs(DELTAS)
    assert payloads[0]["w"].decode().tolist() == [1, -1, 1, -1]
    comp = build_compressor("signsgd")
    assert comp.server_hook is not None
    voted = comp.server_hook(payloads)
    assert [v["w"].tolist() for v in voted] == [[1, -1, 1, 1]] * 3
    tie = comp.server_hook(_signs(DELTAS[:2]))  # two clients: [0,-2,2,0] -> [0,-1,1,0]
    assert tie[0]["w"].tolist() == [0, -1, 1, 0]


def test_signsgd_scaled_vote_by_hand() -> None:
    # scales mean|Δ_k|: 3.6/4 = 0.9, 2.5/4 = 0.625, 5.9/4 = 1.475; mean 3.0/3 = 1.0
    payloads = _signs(DELTAS, scale=True)
    assert float(payloads[0]["w"].scale) == pytest.approx(0.9)  # type: ignore[attr-defined]
    voted = build_compressor("signsgd", scale=True).server_hook(payloads)  # type: ignore[misc]
    assert voted[1]["w"].tolist() == pytest.approx([1.0, -1.0, 1.0, 1.0])


def test_signsgd_vote_keeps_other_entries_and_rejects_misaligned() -> None:
    mask = Mask(torch.tensor([True, False]))
    comp = build_compressor("signsgd")
    p = comp.encode(Payload({"w": encode_dense({"w": torch.ones(2)})["w"], "m": mask}), None,
                    _gen(), 1)[0]  # fmt: skip
    voted = comp.server_hook([p, p])  # type: ignore[misc]
    assert voted[0]["m"] is mask.mask and voted[0]["w"].tolist() == [1.0, 1.0]
    short = comp.encode(encode_dense({"w": torch.ones(3)}), None, _gen(), 1)[0]
    with pytest.raises(ValueError, match="same-shape"):
        comp.server_hook([p, short])  # type: ignore[misc]


def test_signsgd_zero_is_a_seeded_coin() -> None:
    comp = build_compressor("signsgd")
    out = [
        comp.encode(encode_dense({"w": torch.zeros(64)}), None, _gen(s), 1)[0] for s in (0, 0, 1)
    ]
    a, b, c = (o["w"].decode() for o in out)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert 0 < int((a > 0).sum()) < 64


def test_signsgd_bits_by_hand() -> None:
    # w: 2×5, b: 3 -> 13 sign bits; with a scale +32 per tensor -> 13 + 64 = 77
    payload = encode_dense({"w": torch.randn(2, 5, generator=_gen()), "b": torch.ones(3)})
    plain = build_compressor("signsgd").encode(payload, None, _gen(), 1)[0]
    scaled = build_compressor("signsgd", scale=True).encode(payload, None, _gen(), 1)[0]
    assert isinstance(plain["w"], Signs) and plain["w"].decode().shape == (2, 5)
    assert plain.nbits().total == 13
    assert (scaled.nbits().payload, scaled.nbits().meta) == (13, 64)


@pytest.mark.parametrize("s", [2, 127])
def test_fedpaq_is_unbiased_and_on_the_grid(s: int) -> None:
    x = torch.randn(50, generator=_gen(1))
    g = _gen(2)
    draws = torch.stack([quantize(x, s, g).decode() for _ in range(4000)])  # (4000, 50)
    norm = torch.linalg.vector_norm(x)
    # per value Var ≤ (‖x‖/s)²/4, so the mean's sd ≤ ‖x‖/(2s·√4000); allow 6 sd
    tol = 6 * float(norm) / (2 * s * 4000**0.5)
    torch.testing.assert_close(draws.mean(0), x, rtol=0, atol=tol)
    levels = quantize(x, s, g).levels
    assert levels.abs().max() <= s
    assert torch.all(torch.sign(levels) * torch.sign(x) >= 0)  # never the wrong sign
    grid = draws * s / norm  # integers up to float rounding
    torch.testing.assert_close(grid, grid.round(), rtol=0, atol=1e-4)


def test_fedpaq_zero_tensor_and_bits_by_hand() -> None:
    assert quantize(torch.zeros(4), 127, _gen()).decode().tolist() == [0.0] * 4
    # s = 127: 1 sign + 7 level bits; w: 10 values, b: 3 -> 8·13 + 2·32 (norms) = 168
    payload = encode_dense({"w": torch.randn(2, 5, generator=_gen()), "b": torch.ones(3)})
    out = build_compressor("fedpaq").encode(payload, None, _gen(), 1)[0]
    assert isinstance(out["w"], Quantized) and out["w"].decode().shape == (2, 5)
    assert out.nbits().total == 168
    coarse = build_compressor("fedpaq", levels=2).encode(payload, None, _gen(), 1)[0]
    assert coarse.nbits().total == 3 * 13 + 64  # s = 2: 1 + ceil(log2 3) = 3 bits
    assert [bits.quantized_width(s) for s in (1, 2, 127, 128, 255)] == [2, 3, 8, 9, 9]
