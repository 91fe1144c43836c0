"""One seed drives everything: named, independent random streams derived from it.

Every random choice takes its generator from ``(seed, stream, *keys)`` through
:class:`numpy.random.SeedSequence`, so streams never overlap, the order in which clients run
does not matter, and a resumed run draws exactly what an uninterrupted one would.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
import torch


class Stream(IntEnum):
    """Stable stream ids (never renumber: they are part of every result's seed)."""

    PARTITION = 1
    SPLIT = 2
    INIT = 3
    SAMPLING = 4
    CLIENT = 5
    SERVER = 6
    EVAL = 7
    ALGORITHM = 8  # algorithm-internal randomness both sides can replay (e.g. dropout masks)
    SYSTEM = 9  # the system section's simulated clients: links, speeds, who is online, the cohort
    DROPOUT = 10  # a client's dropout masks in a round (jobs' nn.Dropout layers, both backends)
    NOISE = 11  # counter-based per-step noise drawn on the device (fedcomm.philox; FedBIAD's)


def seed_sequence(seed: int, stream: Stream, *keys: int) -> np.random.SeedSequence:
    """The seed sequence of ``stream`` at ``keys`` (e.g. ``(round_, client_id)``)."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    # the key count is part of the entropy: numpy zero-pads, so (s, st) and (s, st, 0) would collide
    return np.random.SeedSequence([seed, int(stream), len(keys), *(int(k) for k in keys)])


def numpy_rng(seed: int, stream: Stream, *keys: int) -> np.random.Generator:
    """A numpy generator for ``(seed, stream, *keys)``."""
    return np.random.default_rng(seed_sequence(seed, stream, *keys))


def torch_generator(seed: int, stream: Stream, *keys: int) -> torch.Generator:
    """A CPU torch generator for ``(seed, stream, *keys)``."""
    state = seed_sequence(seed, stream, *keys).generate_state(1, dtype=np.uint64)[0]
    g = torch.Generator()
    g.manual_seed(int(state) & ((1 << 63) - 1))
    return g
