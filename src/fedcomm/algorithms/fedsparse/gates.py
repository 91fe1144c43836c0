"""FedSparse's gates: θ (server) and π (client) from group norms, the hard-concrete relaxation.

Louizos et al., "An Expectation-Maximization Perspective on Federated Learning" (arXiv:2111.10192)
Eq. 23 and Appendix H; the relaxation is the hard concrete of Louizos, Welling, Kingma, "Learning
Sparse Neural Networks through L0 Regularization" (2018), Eq. 10, with β = 2/3, γ = −0.1, ζ = 1.1.

Per group g (Section 3.2, Eq. 23): ``θ_g = σ((‖w_g‖ − softplus(v_g))/T)``
from the server's ``(w, v)``, ``π_sg`` the same from client s's ``(w_s, v_s)``; the norms are
detached, so a gate cannot be lowered just by shrinking its weights. A group whose initial norm is
below ``T·logit(init_theta)`` (≈ 4.6e-3) cannot start at ``init_theta``; its ``v`` is clamped
(θ between 0.5 and 0.99).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from fedcomm.models.groups import GroupSpec, group_norms, group_norms_detached
from fedcomm.types import ParamDict

BETA, GAMMA, ZETA = 2 / 3, -0.1, 1.1  # hard-concrete (Louizos et al. 2018, the L0 paper)
L0_SHIFT = -BETA * math.log(-GAMMA / ZETA)  # ≈ 1.599: P(z > 0) = σ(log α + L0_SHIFT)


def softplus_inv(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))  # log(exp(y) − 1), stable


def gate_logits(
    params: Mapping[str, Tensor], v: Mapping[str, Tensor], spec: GroupSpec, T: float
) -> Tensor:
    """``(‖w_g‖ − softplus(v_g)) / T`` with the norm detached: logit θ (or logit π). Eq. 23"""
    return (group_norms_detached(params, spec) - F.softplus(v[spec.name])) / T  # (count,)


def gate_probs(
    params: Mapping[str, Tensor], v: Mapping[str, Tensor], specs: Sequence[GroupSpec], T: float
) -> ParamDict:
    """θ (or π) of every group, ``(count,)`` per spec (Algorithm 1 line 4, Algorithm 2 line 2)."""
    return {s.name: torch.sigmoid(gate_logits(params, v, s, T)) for s in specs}


def initial_v(
    params: Mapping[str, Tensor], specs: Sequence[GroupSpec], T: float, init_theta: float
) -> ParamDict:
    """``v_g = softplus⁻¹(‖w_g‖ − T·logit θ0)``, so every θ_g starts at ``init_theta`` (a dense
    start, Appendix A), clamped where the norm is too small for that."""
    logit0 = math.log(init_theta / (1 - init_theta))
    return {
        s.name: softplus_inv((group_norms(params, s) - T * logit0).clamp_min(1e-6)).detach()
        for s in specs
    }


def hard_concrete(log_alpha: Tensor, u: Tensor) -> Tensor:
    """Stretched, clamped binary-concrete sample in [0, 1] (Louizos et al. 2018, Eq. 10)."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return torch.clamp(s * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def sample_z(pi: Tensor, generator: torch.Generator, force_on: bool) -> Tensor:
    """Exact binary upload gates ``z ~ Bern(π)`` (all ones when gates are forced on)."""
    if force_on:
        return torch.ones(pi.shape, dtype=torch.bool, device=pi.device)
    # drawn on the (CPU) generator, so the gates, and the bits they cost, are device-independent
    return torch.bernoulli(pi.to(generator.device), generator=generator).bool().to(pi.device)
