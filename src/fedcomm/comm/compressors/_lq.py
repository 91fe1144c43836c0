"""The arithmetic of ProgFed's LQ-b (random Hadamard rotation + linear stochastic quantisation),
shared by :mod:`~fedcomm.comm.compressors.lq`, :mod:`~fedcomm.comm.compressors.sp` and the
:class:`~fedcomm.comm.compressors._entries.LinearQuantized` entry that decodes it.

A tensor is viewed as a matrix ``X`` of shape ``n1 × n2`` (``n1`` = its first dim; a 1-D
tensor is ``numel × 1``, a scalar ``1 × 1``). The rotations act on dim 0:

* ``truncated`` (the official code): ``T = H_{2^⌈log2 n1⌉}[:n1, :n1]``, the Sylvester Hadamard
  matrix truncated to ``n1 × n1`` (entries ±1, not normalised); ``Y = (T·X) ⊙ D``.
* ``padded``: ``X`` padded with zero rows to ``N = 2^⌈log2 n1⌉``, then the orthonormal
  ``Y = (H_N/√N · X_pad) ⊙ D`` (all ``N × n2`` entries are quantised and sent).
* ``none``: ``Y = X``.

``D`` is an i.i.d. ±1 matrix of ``Y``'s shape regenerated from a seed. Every transform runs in
float64 through a fast Walsh–Hadamard transform (O(n log n) per column, no dense matrix).

``T`` is inverted exactly in O(n log n) too. With ``N`` the largest power of two below ``n``
(``m = n − N``), Sylvester's ``H_{2N} = [[H_N, H_N], [H_N, −H_N]]`` gives
``T_n = [[H_N, H_N E], [Eᵀ H_N, −T_m]]`` (``E = [I_m; 0]``), whose Schur complement is
``−2 T_m``; so ``T_n (x1; x2) = (z1; z2)`` is solved by::

    x2 = T_m⁻¹ ((z1[:m] − z2) / 2)
    x1 = H_N z1 / N − (x2; 0)

recursing once per set bit of ``n`` (``T_1 = [1]``). Hence ``T_n`` is invertible for every
``n``; its condition number is ``√N`` for a power of two and was at most 32 for ``n1 ≤ 600``
(worst at 537) and 64 on a sample of ``n1 ≤ 4096``.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

Rotation = Literal["truncated", "padded", "none"]
ROTATIONS: tuple[str, ...] = ("truncated", "padded", "none")
SEED_HIGH = 2**31 - 1  # seeds are drawn in [0, 2**31 - 1) and sent as 32 bits


def check_options(bits: int, rotation: str) -> None:
    """``bits`` in 1..8 (levels are stored as uint8) and a known ``rotation``."""
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8 (uint8 levels), got {bits}")
    if rotation not in ROTATIONS:
        raise ValueError(f"rotation must be one of {ROTATIONS}, got {rotation!r}")


def draw_seed(generator: torch.Generator) -> int:
    """A 31-bit seed from ``generator`` (sent as a 32-bit scalar)."""
    return int(torch.randint(0, SEED_HIGH, (1,), generator=generator, device=generator.device))


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """``(n1, n2)``: the first dim and the rest (1-D: ``(numel, 1)``; a scalar: ``(1, 1)``)."""
    if not shape:
        return 1, 1
    return shape[0], math.prod(shape[1:])


def padded_rows(n1: int) -> int:
    """``2^⌈log2 n1⌉``, the Sylvester order used for ``n1`` rows (0 for 0)."""
    return 0 if n1 == 0 else 1 << (n1 - 1).bit_length()


def fwht(x: Tensor) -> Tensor:
    """``H_N @ x`` along dim 0 (``N`` = rows, a power of two), Sylvester order, unnormalised."""
    n = x.shape[0]
    if n & (n - 1):
        raise ValueError(f"fwht needs a power-of-two number of rows, got {n}")
    rest = x.shape[1:]
    y = x
    h = 1
    while h < n:
        y = y.reshape(n // (2 * h), 2, h, *rest)
        a, b = y[:, 0], y[:, 1]
        y = torch.stack((a + b, a - b), dim=1)
        h *= 2
    return y.reshape(x.shape)


def _pad_rows(x: Tensor, rows: int) -> Tensor:
    if rows == x.shape[0]:
        return x
    return torch.cat((x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))))


def truncated_apply(x: Tensor) -> Tensor:
    """``T_{n1} @ x`` for ``x`` of ``n1`` rows: the first ``n1`` rows of ``H_N @ (x; 0)``."""
    n1 = x.shape[0]
    return fwht(_pad_rows(x, padded_rows(n1)))[:n1]


def truncated_solve(z: Tensor) -> Tensor:
    """``T_n⁻¹ @ z`` for ``z`` of ``n`` rows, exactly, by the recursion in the module docstring."""
    n = z.shape[0]
    if n == 0:
        return z.clone()
    big = 1 << (n.bit_length() - 1)  # the largest power of two <= n
    if big == n:
        return fwht(z) / n
    m = n - big
    z1, z2 = z[:big], z[big:]
    x2 = truncated_solve((z1[:m] - z2) / 2)
    x1 = fwht(z1) / big
    x1[:m] -= x2
    return torch.cat((x1, x2))


def truncated_hadamard(n1: int, device: torch.device | str = "cpu") -> Tensor:
    """The dense ``n1 × n1`` truncated Sylvester Hadamard matrix (float64; a reference)."""
    return truncated_apply(torch.eye(n1, dtype=torch.float64, device=device))


def sign_flips(seed: int, shape: tuple[int, ...], device: torch.device | str = "cpu") -> Tensor:
    """``D``'s signs on ``device``, bool (``True`` = +1), drawn on the CPU (so the same whatever
    ``device``) from ``torch.Generator().manual_seed(seed)``."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    signs = torch.randint(0, 2, shape, generator=g, dtype=torch.uint8, device="cpu").bool()
    return signs.to(device)


def _flip(y: Tensor, signs: Tensor) -> Tensor:
    return torch.where(signs, y, -y)


def rotate(x: Tensor, rotation: Rotation, seed: int | None) -> Tensor:
    """``Y`` (float64) from the ``n1 × n2`` matrix ``x``: ``n1`` rows (``padded``: ``2^k``)."""
    x = x.to(torch.float64)
    if rotation == "none":
        return x
    assert seed is not None
    if rotation == "truncated":
        y = truncated_apply(x)
    else:
        rows = padded_rows(x.shape[0])
        y = fwht(_pad_rows(x, rows)) / math.sqrt(rows)
    return _flip(y, sign_flips(seed, tuple(y.shape), y.device))


def unrotate(y: Tensor, rotation: Rotation, seed: int | None, n1: int) -> Tensor:
    """The ``n1 × n2`` matrix ``X̂`` (float64) from ``Ŷ``: ``H⁻¹ (Ŷ ⊙ D)``."""
    y = y.to(torch.float64)
    if rotation == "none":
        return y
    assert seed is not None
    z = _flip(y, sign_flips(seed, tuple(y.shape), y.device))
    if rotation == "truncated":
        return truncated_solve(z)
    return (fwht(z) / math.sqrt(z.shape[0]))[:n1]  # H_N/√N is its own inverse


def quantize_levels(
    y: Tensor, bits: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Stochastic rounding of ``y`` onto ``2^b`` levels of ``[min y, max y]``.

    Returns ``(q, v_min, v_max)``: ``q`` uint8 in ``[0, 2^b − 1]`` with
    ``E[q] = u = (y − v_min)/(v_max − v_min)·(2^b − 1)`` (``q = ⌈u⌉ − 1[ξ < ⌈u⌉ − u]``,
    ``ξ ~ U(0, 1)`` from ``generator``); ``v_min``, ``v_max`` float32 scalars. A constant ``y``
    gives ``q = 0`` and decodes to ``v_min`` exactly.
    """
    y32 = y.to(torch.float32)
    if y32.numel() == 0:
        zero = torch.zeros((), dtype=torch.float32, device=y.device)
        return torch.zeros(y.shape, dtype=torch.uint8, device=y.device), zero, zero.clone()
    v_min, v_max = y32.min(), y32.max()
    span = float(v_max) - float(v_min)
    top = 2**bits - 1
    if span == 0.0:
        return torch.zeros(y.shape, dtype=torch.uint8, device=y.device), v_min, v_max
    u = ((y32.to(torch.float64) - float(v_min)) * (top / span)).clamp_(0, top)
    up = torch.ceil(u)
    # drawn on the generator's device (CPU), so the draws do not depend on y's device
    xi = torch.rand(u.shape, generator=generator, dtype=torch.float64, device=generator.device)
    xi = xi.to(u.device)
    q = (up - (xi < up - u).to(torch.float64)).clamp_(0, top)
    return q.to(torch.uint8), v_min, v_max


def dequantize(q: Tensor, v_min: Tensor, v_max: Tensor, bits: int) -> Tensor:
    """``Ŷ = q·(v_max − v_min)/(2^b − 1) + v_min`` in float64."""
    lo = float(v_min)
    step = (float(v_max) - lo) / (2**bits - 1)
    return q.to(torch.float64) * step + lo
