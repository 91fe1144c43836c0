"""Counter-based random numbers on any device: Philox4x32-10 in plain torch integer arithmetic.

A stateful generator (``torch.Generator``) draws on one device, so draws made for a GPU run come
from the CPU and are copied over (FedBIAD's per-step weight noise: a model's worth every step).
Philox (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011) is a keyed
bijection of a 128-bit counter: entry ``i`` of a draw is a function of ``(key, counter(i))``
alone, computed where the tensor lives, with no state and no copy. The rounds here use only
int64 additions, ANDs, XORs, shifts and products below 2^48, so the 32-bit words are the same on
every device (checked against Random123's known-answer vectors). The normals come from those
words by Box-Muller in float32; ``log``, ``sqrt``, ``cos`` and ``sin`` are rounded by each
device's own math library, so a normal may differ between a CPU and a GPU in its last bits
(never more than a few ulps), and training on the two differs from then on as any two float
programs do (:mod:`fedcomm.simulation.device`).

Counters: a draw of ``n`` normals for ``(key, step, slot)`` uses counters ``(j, 0, step, slot)``
for ``j < ceil(n / 4)``, four normals each (two Box-Muller pairs).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from fedcomm.seeding import Stream, seed_sequence

MASK32 = 0xFFFFFFFF
M0, M1 = 0xD2511F53, 0xCD9E8D57  # Philox4x32's multipliers
W0, W1 = 0x9E3779B9, 0xBB67AE85  # its Weyl key increments
ROUNDS = 10


def _mulhilo(a: int, b: Tensor) -> tuple[Tensor, Tensor]:
    """The high and low 32-bit words of ``a * b`` (``a`` a 32-bit constant, ``b`` int64 words
    < 2^32), with no intermediate at or above 2^49."""
    b_hi, b_lo = b >> 16, b & 0xFFFF
    p_hi, p_lo = a * b_hi, a * b_lo  # each < 2^48
    t = p_lo + ((p_hi & 0xFFFF) << 16)  # the low 48 bits' part, < 2^49
    return (p_hi >> 16) + (t >> 32), t & MASK32


def philox4x32(
    counter: tuple[Tensor, Tensor, Tensor, Tensor], key: tuple[int, int]
) -> list[Tensor]:
    """Philox4x32-10 of the counters (four int64 tensors of 32-bit words, one shape) under the
    64-bit ``key`` (two 32-bit words): four int64 tensors of 32-bit output words."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(ROUNDS):
        hi0, lo0 = _mulhilo(M0, c0)
        hi1, lo1 = _mulhilo(M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + W0) & MASK32, (k1 + W1) & MASK32
    return [c0, c1, c2, c3]


def key_of(seed: int, stream: Stream, *keys: int) -> tuple[int, int]:
    """The 64-bit Philox key of ``(seed, stream, *keys)`` (:mod:`fedcomm.seeding`'s sequence)."""
    state = int(seed_sequence(seed, stream, *keys).generate_state(1, dtype="uint64")[0])
    return state & MASK32, (state >> 32) & MASK32


def normal(
    n: int,
    key: tuple[int, int],
    step: int,
    slot: int,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """``n`` draws of N(0, 1) for ``(key, step, slot)`` on ``device`` (see the module docstring:
    the same words everywhere, the same normals up to the device's last-bit rounding)."""
    blocks = -(-n // 4)
    j = torch.arange(blocks, dtype=torch.int64, device=device)
    zero = torch.zeros_like(j)
    words = philox4x32((j & MASK32, j >> 32, zero + (step & MASK32), zero + (slot & MASK32)), key)
    u = [(w.to(torch.float32) + 0.5) * (1.0 / 2**32) for w in words]  # in (0, 1)
    out = []
    for a, b in ((u[0], u[1]), (u[2], u[3])):
        radius = torch.sqrt(-2.0 * torch.log(a))
        angle = (2.0 * math.pi) * b
        out += [radius * torch.cos(angle), radius * torch.sin(angle)]
    return torch.stack(out, dim=1).reshape(-1)[:n].to(dtype)  # (blocks, 4) -> n
