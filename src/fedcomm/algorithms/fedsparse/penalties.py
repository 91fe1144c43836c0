"""The terms of FedSparse's client objective besides the data loss (Eq. 17 / 39, minimised).

``λ0 Σ_g |g| π_g − c_CE Σ_g [π_g log θ_g + (1 − π_g) log(1 − θ_g)] + (λ/2) Σ_g π_g ‖w_sg − w_g‖²``:
the L0 cost of the kept groups (Eq. 37, λ0 per parameter of a group of |g| parameters), the
cross-entropy from the client's gates π to the server's prior θ (Eq. 38, weighted by c_CE) and
the FedProx-like drift of the kept groups from the server's weights (Eq. 37). π enters each
term itself, as in Eq. 17, not the relaxation's P(z > 0) of Eq. 41.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from fedcomm.models.groups import GroupSpec, group_norms


def l0_cost(cost: Tensor, pi: Tensor) -> Tensor:
    """``Σ_g λ0 |g| π_g``, ``cost`` holding ``λ0 |g|`` per group. Eq. 37"""
    return (cost * pi).sum()


def prior_log_likelihood(pi: Tensor, theta: Tensor) -> Tensor:
    """``Σ_g π_g log θ_g + (1 − π_g) log(1 − θ_g)``: minus the cross-entropy to the prior. Eq. 38"""
    return (pi * theta.log() + (1 - pi) * (1 - theta).log()).sum()


def drift(
    w_s: Mapping[str, Tensor], w: Mapping[str, Tensor], spec: GroupSpec, pi: Tensor
) -> Tensor:
    """``Σ_g π_g ‖w_sg − w_g‖²`` over one spec's groups (λ/2 is the caller's). Eq. 37"""
    diff = {n: w_s[n] - w[n] for n, _ in spec.members}
    return (pi * group_norms(diff, spec) ** 2).sum()
