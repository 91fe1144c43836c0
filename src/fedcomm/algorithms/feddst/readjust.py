"""FedDST's readjustment: the annealed ratio (Eq. 2), magnitude prune and gradient regrow.

A readjusting client, after local epoch ``at_epoch`` (:func:`readjust_step`), takes the dense
gradient ``g`` of plain CE on that epoch's last minibatch, then per maskable layer ``l``:

* :func:`prune`: keep the ``k_l(S')`` largest ``|θ|`` among the active entries, with
  ``S' = S + (1 − S)·α_r`` (:func:`pruned_sparsity`, ``α_r``: :func:`annealed_ratio`, Eq. 2);
* :func:`regrow`: grow ``n = k_l(S) − #kept`` entries of largest ``|g|`` among the
  ``grow_candidates`` (``all``: kept entries too, as the code; ``inactive``) and set them to 0.

:func:`readjust` is both steps on every layer; :class:`Readjustment` says when (``due``: rounds
``1, 1 + ΔR, …`` while ``α_r > 0``) and with what ratio. The schedule's flags and defaults are
documented in :mod:`fedcomm.algorithms.feddst`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from fedcomm.algorithms.core.context import ClientContext, ClientData
from fedcomm.algorithms.feddst import client
from fedcomm.algorithms.feddst.client import frozen_masks, masks_of
from fedcomm.algorithms.sparse import SparseConfig, layers_of
from fedcomm.algorithms.sparse import budgets as _budgets
from fedcomm.algorithms.sparse import codec as _codec
from fedcomm.algorithms.sparse import masks as _masks
from fedcomm.algorithms.sparse.masks import Masks
from fedcomm.types import ParamDict

DEFAULT_READJUST_END = 200  # the code's R // 2 at its default R = 400 rounds


def annealed_ratio(alpha: float, round_: int, end: int, schedule: str) -> float:  # Eq. 2
    """``α_r``, 0 from ``R_end`` on: ``cosine`` ``α/2·(1 + cos(π r / R_end))`` (RigL's intent),
    ``gate_only`` ``α`` (the code: the cosine only decides whether to readjust)."""
    if round_ >= end or alpha <= 0:
        return 0.0
    if schedule == "cosine":
        return alpha / 2 * (1 + math.cos(math.pi * round_ / end))
    return alpha


def pruned_sparsity(S: float, alpha_r: float) -> float:
    """``S' = S + (1 − S)·α_r``: the sparsity a client prunes to before it regrows to ``S``."""
    return S + (1 - S) * alpha_r


@dataclass(frozen=True)
class Readjustment:
    """When and how clients readjust their masks (absent: the mask is fixed)."""

    alpha: float
    every: int = 10
    end: int = DEFAULT_READJUST_END
    schedule: str = "gate_only"
    candidates: str = "all"
    at_epoch: int | None = None
    upload_mask: _codec.MaskCharge = "sent"

    def alpha_at(self, round_: int) -> float:
        """``α_r``: the pruning ratio of round ``round_`` (Eq. 2, :func:`annealed_ratio`)."""
        return annealed_ratio(self.alpha, round_, self.end, self.schedule)

    def due(self, round_: int) -> bool:
        """Rounds ``1, 1 + ΔR, …`` while ``α_r > 0``."""
        return (round_ - 1) % self.every == 0 and self.alpha_at(round_) > 0


def prune(theta: Tensor, mask: Tensor, keep: int) -> Tensor:
    """Magnitude pruning of one layer: its ``keep = k_l(S')`` largest ``|θ|`` among the active
    entries."""
    return _masks.top_k(theta.abs(), keep, mask)


def regrow(grad: Tensor, kept: Tensor, target: int, candidates: str) -> Tensor:
    """``target − #kept`` entries (back to ``k_l(S)``) of largest ``|g|`` among ``candidates``:
    ``all`` entries (the code: kept ones too) or the ``inactive`` ones."""
    n_grow = max(0, target - int(kept.sum()))
    return _masks.top_k(grad.abs(), n_grow, None if candidates == "all" else ~kept)


def readjust(
    params: Mapping[str, Tensor],
    masks: Mapping[str, Tensor],
    grads: Mapping[str, Tensor],
    keep: Mapping[str, int],
    target: Mapping[str, int],
    candidates: str,
) -> tuple[ParamDict, Masks]:
    """Per layer: :func:`prune` to ``keep[l]``, :func:`regrow` to ``target[l]`` and set the grown
    entries to 0. Returns new ``(θ ⊙ m, m)``."""
    new_params, new_masks = dict(params), {}
    for name, m in masks.items():
        kept = prune(params[name], m, keep[name])
        grown = regrow(grads[name], kept, target[name], candidates)
        new_masks[name] = kept | grown
        new_params[name] = torch.where(kept & ~grown, params[name], 0.0)
    return new_params, new_masks


def readjust_step(
    cfg: SparseConfig,
    adjust: Readjustment,
    data: ClientData,
    ctx: ClientContext,
    names: Sequence[str],
    i: int,
    loss: float,
    live: Mapping[str, Tensor],
    frozen: Mapping[str, Tensor],
    idx: Tensor,
) -> tuple[ParamDict, ParamDict]:
    """The client's readjustment after its step ``i`` (a job's ``after_step``): the dense CE
    gradient on that step's minibatch ``idx``, then :func:`readjust`: prune to ``k_l(S')``,
    regrow to ``k_l(S)``."""
    S, layers = cfg.sparsity, layers_of(ctx.model)
    s_prune = pruned_sparsity(S, adjust.alpha_at(ctx.round_))
    current = masks_of(frozen, names)
    grads = client.ce_grads(ctx.model, live, list(current), data.x[idx], data.y[idx])
    new_params, new_masks = readjust(
        live,
        current,
        grads,
        _budgets.layer_budgets(layers, s_prune, cfg.distribution),
        _budgets.layer_budgets(layers, S, cfg.distribution),
        adjust.candidates,
    )
    return {k: new_params[k] for k in new_masks}, frozen_masks(new_masks)
