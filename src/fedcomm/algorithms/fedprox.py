"""FedProx: FedAvg with a proximal local term.

Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020 (arXiv:1812.06127).
Client ``k`` minimises ``f_k(w) + (μ/2)·‖w − w_t‖²``, i.e. adds ``μ(w − w_t)`` to every local
gradient. ``μ = 0`` is exactly FedAvg (a contract test checks it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field
from torch import Tensor

from fedcomm.algorithms import fedavg
from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm, register
from fedcomm.algorithms.core import local as _local


class Config(AlgorithmConfig):
    name: Literal["fedprox"] = "fedprox"
    mu: float = Field(0.01, ge=0, description="proximal coefficient μ")
    weighting: Literal["num_examples", "uniform"] = "num_examples"


def proximal_hook(mu: float) -> _local.GradHookFactory:
    """``w_t ↦ (grads ↦ grads + μ(w − w_t))``."""

    def for_anchor(anchor: Mapping[str, Tensor]) -> _local.GradHook:
        def hook(params: Mapping[str, Tensor], grads: dict[str, Tensor]) -> dict[str, Tensor]:
            if mu == 0:
                return grads
            return {k: g + mu * (params[k].detach() - anchor[k]) for k, g in grads.items()}

        return hook

    return for_anchor


def anchored_proximal(mu: float) -> _local.GradHook:
    """``grads ↦ grads + μ(w − w_t)`` with ``w_t`` read from ``full[fedavg.ANCHOR + name]``
    (the batchable form: the anchor is a per-client tensor, not a closure)."""

    def hook(full: Mapping[str, Tensor], grads: dict[str, Tensor]) -> dict[str, Tensor]:
        if mu == 0:
            return grads
        return {k: g + mu * (full[k].detach() - full[fedavg.ANCHOR + k]) for k, g in grads.items()}

    return hook


@register(Config)
def build(cfg: Config) -> FedAlgorithm[fedavg.ServerState]:
    return fedavg.make(cfg, cfg.weighting, anchored_hook=anchored_proximal(cfg.mu))
