"""PruneFL's adaptive mask update: which entries stay (:func:`readjust`), when, and with what ``p``.

:func:`readjust`, from gradients ``g`` of the maskable entries, per-entry times ``t_l`` of their
layers (:mod:`fedcomm.algorithms.prunefl.times`) and the pruned fraction ``p``: take entries in
descending ``g²`` while ``g²/t_l ≥ Σ g²/(c + Σ t)`` over the entries already taken (``c``:
``time_offset``, the code's ``t = 0.2``) or while at most ``(1 − p)·N`` have been taken (the
code's ``n_grown <= n_required``, so ``⌊(1 − p)·N⌋ + 1`` are always kept); stop at the first
entry that meets neither. The mask is the entries taken. ``p = p_initial`` in phase one,
``p_federated · p_decay^j`` at the j-th federated readjustment (:func:`prune_fraction`;
``p_exponent: round``: the code's ``0.3·0.5^server_round``, 0-based). Readjustments happen in
rounds ``first_readjust + k·every`` (:func:`is_readjust`); a federated one uses the unweighted
mean of the clients' uploaded gradients
(:func:`fedcomm.algorithms.prunefl.client.mean_gradient`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch
from torch import Tensor


def readjust(
    grads: Mapping[str, Tensor], times: Mapping[str, float], p: float, offset: float
) -> dict[str, Tensor]:
    """PruneFL's new mask (bool, per key of ``grads``): entries in descending ``g²`` (ties in
    key-then-index order) while ``g²/t ≥ Σg²/(c + Σt)`` over those taken, or while at most
    ``(1 − p)·N`` are taken."""
    names = list(grads)
    g2 = torch.cat([grads[n].detach().reshape(-1).double() ** 2 for n in names])  # (N,)
    dev = g2.device
    t = torch.cat(
        [torch.full((grads[n].numel(),), times[n], dtype=torch.float64, device=dev) for n in names]
    )
    order = torch.sort(g2, descending=True, stable=True).indices
    g2s, ts = g2[order], t[order]
    before_g2 = torch.cumsum(g2s, 0) - g2s  # Σg² of the entries taken before this one
    denom = offset + torch.cumsum(ts, 0) - ts
    bar = torch.where(denom > 0, before_g2 / denom.clamp_min(1e-300), 0.0)
    floor = round((1.0 - p) * g2.numel(), 9)  # guarded: 0.7·10 = 7.000000000000001
    ok = (g2s / ts >= bar) | (torch.arange(g2.numel(), dtype=torch.float64, device=dev) <= floor)
    kept = int(ok.numel()) if bool(ok.all()) else int((~ok).nonzero()[0])
    flat = torch.zeros(g2.numel(), dtype=torch.bool, device=dev)
    flat[order[:kept]] = True
    pieces = flat.split([grads[n].numel() for n in names])
    return {n: m.reshape(grads[n].shape) for n, m in zip(names, pieces, strict=True)}


class Decay(Protocol):
    """The fields of :class:`fedcomm.algorithms.prunefl.Config` that set ``p`` (read-only)."""

    @property
    def p_federated(self) -> float:
        """``p`` at the first federated readjustment, before any decay."""

    @property
    def p_decay(self) -> float:
        """The factor ``p`` shrinks by at each step of ``j``."""

    @property
    def p_exponent(self) -> str:
        """``j``: ``readjustment`` (the federated readjustment's index) or ``round`` (round − 1)."""


def prune_fraction(cfg: Decay, readjustment: int, round_: int) -> float:
    """``p`` at the ``readjustment``-th federated readjustment (1-based), in round ``round_``."""
    j = readjustment if cfg.p_exponent == "readjustment" else round_ - 1
    return cfg.p_federated * cfg.p_decay**j


def is_readjust(round_: int, first: int, every: int) -> bool:
    """Rounds ``first, first + every, …`` (1-based; the code's 0-based ``(r − 1) % ΔR == 0``)."""
    return round_ >= first and (round_ - first) % every == 0
