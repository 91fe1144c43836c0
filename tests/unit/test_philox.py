"""Counter-based normals (fedcomm.philox): Philox4x32-10 against Random123's known answers, and
the normals' replay and distribution."""

from __future__ import annotations

import pytest
import torch

from fedcomm import philox
from fedcomm.seeding import Stream

F = 0xFFFFFFFF
# Random123's kat_vectors for philox4x32 with 10 rounds: counter, key -> output
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((F, F, F, F), (F, F), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    (
        (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
        (0xA4093822, 0x299F31D0),
        (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
    ),
]


@pytest.mark.parametrize(("counter", "key", "expected"), KAT)
def test_philox_matches_random123(
    counter: tuple[int, ...], key: tuple[int, int], expected: tuple[int, ...]
) -> None:
    words = tuple(torch.tensor([c, c], dtype=torch.int64) for c in counter)
    out = philox.philox4x32(words, key)  # type: ignore[arg-type]
    assert [int(w[0]) for w in out] == list(expected)
    assert all(int(w[1]) == int(w[0]) for w in out)  # elementwise: a function of the counter


def test_normals_replay_and_depend_on_key_step_and_slot() -> None:
    key = philox.key_of(3, Stream.NOISE, 2, 7)
    a = philox.normal(1001, key, 5, 0)
    assert a.shape == (1001,) and a.dtype == torch.float32
    assert torch.equal(a, philox.normal(1001, key, 5, 0))
    assert torch.equal(a[:998], philox.normal(998, key, 5, 0))  # entry i: its counter's alone
    others = [
        philox.normal(1001, key, 6, 0),
        philox.normal(1001, key, 5, 1),
        philox.normal(1001, philox.key_of(3, Stream.NOISE, 2, 8), 5, 0),
    ]
    assert all(not torch.allclose(a, b) for b in others)
    assert philox.normal(8, key, 0, 0, dtype=torch.float64).dtype == torch.float64


def test_normals_are_standard_normal() -> None:
    z = philox.normal(400_000, philox.key_of(0, Stream.NOISE, 1, 1), 0, 0)
    assert float(z.mean()) == pytest.approx(0.0, abs=0.01)  # sd of the mean: 0.0016
    assert float(z.std()) == pytest.approx(1.0, abs=0.01)
    assert float((z.abs() > 1.96).float().mean()) == pytest.approx(0.05, abs=0.003)
    assert bool(torch.isfinite(z).all())
