"""FedSparse's server M-step pieces (Appendix I, Algorithm 1; the pruning: Section 3.1).

``g_w = Σ_s p_s z_s ⊙ (ŵ_s − w)`` feeds Adam, ``g_v = Σ_s p_s · −(z_s − θ) σ(v)/T`` feeds Adamax
(both ascent directions; ``p_s`` the client weights: Algorithm 1 sums, the default is the plain
mean); then groups with ``θ ≤ ε`` are pruned for good, their weights zeroed and, beyond the
paper, their Adam moments too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from fedcomm.algorithms.core.grouped import entry_masks, member_axes, scatter_mask
from fedcomm.algorithms.fedsparse.gates import gate_probs
from fedcomm.models.groups import GroupSpec
from fedcomm.types import ParamDict


def uploaded_gates(
    uploads: Sequence[Mapping[str, Tensor]], alive: Mapping[str, Tensor], specs: Sequence[GroupSpec]
) -> list[dict[str, Tensor]]:
    """Each client's ``z_s`` over all groups (sent for the surviving groups only)."""
    return [
        {s.name: scatter_mask(up[f"mask/{s.name}"], alive[s.name]) for s in specs} for up in uploads
    ]


def weight_gradient(
    params: ParamDict,
    uploads: Sequence[Mapping[str, Tensor]],
    zs: Sequence[Mapping[str, Tensor]],
    weights: Tensor,
    specs: Sequence[GroupSpec],
) -> ParamDict:
    """The server's ``Σ_s p_s z_s ⊙ (ŵ_s − w)`` (ungated parameters: ``z_s ≡ 1``), each upload
    added straight into its kept slices (``index_add_`` of ``p_s (ŵ_s − w)`` there; nothing
    elsewhere, where ``z_s = 0``): no full-size decode, mask or product per client. Differences
    are taken before the sum, as Algorithm 1 writes it per client, ``p_s z_s ⊙ (ŵ_s − w)`` over
    full-size decoded uploads (a server Adam step is sensitive to the rounding of tiny means),
    and agree with that form to the bit (tested)."""
    axes = member_axes(specs)
    p = [float(wt) for wt in weights]  # (one read of the K weights)
    out: ParamDict = {k: torch.zeros_like(t) for k, t in params.items()}
    for up, z, ps in zip(uploads, zs, p, strict=True):
        for k, w in params.items():
            values = up[f"w/{k}"]
            # (product, then sum: a fused multiply-add would round differently)
            if k not in axes or bool(z[axes[k][0].name].all()):
                out[k].add_((values.reshape(w.shape) - w).mul_(ps))
                continue
            spec, axis = axes[k]
            idx = z[spec.name].nonzero().flatten()  # the kept groups, ascending
            sel = list(w.shape)
            sel[axis] = idx.numel()
            diff = values.reshape(sel) - w.index_select(axis, idx)
            out[k].index_add_(axis, idx, diff.mul_(ps))
    return out


def v_gradient(
    z: Sequence[Tensor], theta: Tensor, v: Tensor, T: float, weights: Tensor | None = None
) -> Tensor:
    """Closed-form ascent direction for v: ``Σ_s p_s · −(z_s − θ) σ(v) / T`` (Algorithm 1) with
    client weights ``p_s`` summing to 1 (default: the plain mean over clients)."""
    per_client = torch.stack([-(zs.float() - theta) * torch.sigmoid(v) / T for zs in z])
    p = torch.full((len(z),), 1 / len(z), device=v.device) if weights is None else weights
    return (p.reshape(-1, 1) * per_client).sum(0)


def prune(alive: Mapping[str, Tensor], theta: Mapping[str, Tensor], threshold: float) -> ParamDict:
    """``alive ∧ (θ > ε)``: a pruned group never comes back. Algorithm 1 line 5"""
    return {k: a & (theta[k] > threshold) for k, a in alive.items()}


def zero_pruned(
    params: ParamDict, opt_state: Any, alive: Mapping[str, Tensor], specs: Sequence[GroupSpec]
) -> tuple[ParamDict, Any]:
    """The pruned groups' weights (Algorithm 1 line 5) and, beyond it, optimizer moments zeroed."""
    keep = entry_masks(specs, alive, params)
    params = {k: t * keep[k] if k in keep else t for k, t in params.items()}
    return params, mask_moments(opt_state, keep)


def server_metrics(
    params: ParamDict,
    v: ParamDict,
    alive: Mapping[str, Tensor],
    specs: Sequence[GroupSpec],
    T: float,
) -> dict[str, float]:
    """Logged per round: the fraction of groups alive and the mean ``θ`` (over every group)."""
    alive_ = torch.cat([a.float() for a in alive.values()])
    theta = torch.cat(list(gate_probs(params, v, specs, T).values()))
    return {
        "fedsparse/groups_alive": float(alive_.mean()),
        "fedsparse/theta_mean": float(theta.mean()),
    }


def mask_moments(state: Any, keep: Mapping[str, Tensor]) -> Any:
    """Zero optimizer moments of pruned entries (beyond Algorithm 1) in any nested opt state."""
    if isinstance(state, dict):
        return {
            k: t * keep[k] if k in keep and isinstance(t, Tensor) else mask_moments(t, keep)
            for k, t in state.items()
        }
    if isinstance(state, tuple):
        return tuple(mask_moments(s, keep) for s in state)
    return state
