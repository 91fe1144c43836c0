"""Named random streams from one seed: reproducible, independent, order-free."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from fedcomm.seeding import Stream, numpy_rng, seed_sequence, torch_generator


def _draw(seed: int, stream: Stream, *keys: int) -> list[int]:
    return numpy_rng(seed, stream, *keys).integers(0, 2**62, size=4).tolist()


def _tdraw(seed: int, stream: Stream, *keys: int) -> list[int]:
    return torch.randint(0, 2**62, (4,), generator=torch_generator(seed, stream, *keys)).tolist()


def test_stream_ids_are_stable() -> None:
    # Part of every result's seed: renumbering would silently change all results.
    assert {s.name: int(s) for s in Stream} == {
        "PARTITION": 1,
        "SPLIT": 2,
        "INIT": 3,
        "SAMPLING": 4,
        "CLIENT": 5,
        "SERVER": 6,
        "EVAL": 7,
        "ALGORITHM": 8,
        "SYSTEM": 9,
        "DROPOUT": 10,
        "NOISE": 11,
    }


def test_numpy_streams_reproducible() -> None:
    assert _draw(0, Stream.CLIENT, 3, 7) == _draw(0, Stream.CLIENT, 3, 7)
    a = numpy_rng(5, Stream.PARTITION)
    b = numpy_rng(5, Stream.PARTITION)
    assert np.array_equal(a.permutation(100), b.permutation(100))


def test_numpy_streams_independent() -> None:
    seeds_streams = [(seed, stream) for seed in (0, 1, 2) for stream in Stream]
    draws = {tuple(_draw(seed, stream)) for seed, stream in seeds_streams}
    assert len(draws) == len(seeds_streams)  # every (seed, stream) pair differs
    # per (round, client) keys: all distinct, and (r, c) differs from (c, r)
    keyed = {
        tuple(_draw(0, Stream.CLIENT, r, c)) for r, c in itertools.product(range(1, 6), range(6))
    }
    assert len(keyed) == 30


def test_draws_do_not_depend_on_order() -> None:
    # Client 3's generator is the same whether or not client 2 drew first.
    first = _draw(0, Stream.CLIENT, 1, 3)
    numpy_rng(0, Stream.CLIENT, 1, 2).integers(0, 10, size=1000)
    assert _draw(0, Stream.CLIENT, 1, 3) == first


def test_streams_are_uncorrelated() -> None:
    a = numpy_rng(0, Stream.CLIENT, 1, 0).standard_normal(20_000)
    b = numpy_rng(0, Stream.CLIENT, 1, 1).standard_normal(20_000)
    # |corr| of independent N(0,1) samples is ~ 1/sqrt(n) = 0.007; 0.04 is > 5 sigma
    assert abs(float(np.corrcoef(a, b)[0, 1])) < 0.04


def test_seed_sequence_entropy() -> None:
    assert seed_sequence(9, Stream.SAMPLING, 4).entropy == [9, 4, 1, 4]  # seed, stream, #keys, keys
    # the key count keeps (seed, stream) and (seed, stream, 0) apart (numpy zero-pads entropy)
    a = seed_sequence(9, Stream.SAMPLING).generate_state(2).tolist()
    assert a != seed_sequence(9, Stream.SAMPLING, 0).generate_state(2).tolist()


@pytest.mark.parametrize("make", [seed_sequence, numpy_rng, torch_generator])
def test_negative_seed_is_an_error(make: object) -> None:
    with pytest.raises(ValueError, match="seed must be >= 0"):
        make(-1, Stream.INIT)  # type: ignore[operator]


def test_torch_generator_reproducible_and_independent() -> None:
    assert _tdraw(0, Stream.INIT) == _tdraw(0, Stream.INIT)
    g1 = torch_generator(3, Stream.CLIENT, 2, 5)
    g2 = torch_generator(3, Stream.CLIENT, 2, 5)
    assert torch.equal(torch.randperm(50, generator=g1), torch.randperm(50, generator=g2))
    assert torch.equal(torch.randn(8, generator=g1), torch.randn(8, generator=g2))
    draws = {
        tuple(_tdraw(seed, stream, *keys))
        for seed in (0, 1)
        for stream in (Stream.INIT, Stream.CLIENT)
        for keys in ((1, 0), (1, 1), (2, 0))
    }
    assert len(draws) == 12


def test_torch_generator_seed_fits_63_bits() -> None:
    for seed in range(20):
        assert 0 <= torch_generator(seed, Stream.SERVER, seed).initial_seed() < 2**63
