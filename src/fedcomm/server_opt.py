"""Composable server optimizers on the mean client delta (optax style).

The server receives the (weighted) mean client delta ``Δ = mean_k (w_k - w)``, an *ascent*
direction, and applies ``w ← w + update(Δ)``. A transform is a pair of pure functions
``init(params) -> state`` and ``update(delta, state) -> (step, state)``; transforms compose
with :func:`chain`. Presets:

* FedAvg  = ``sgd(lr=1)``: ``w ← w + Δ`` (plain averaging of the client models);
* FedAvgM = ``momentum(lr, beta)``: ``m ← βm + Δ; w ← w + lr·m`` (Hsu et al., 2019);
* FedAdam = ``adam(lr, b1, b2, eps)`` (Reddi et al., ICLR 2021; the FedSparse paper uses Adam
  with bias correction on the difference gradient for every method, ``bias_correction=True``);
* ``adamax`` for FedSparse's gate parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from fedcomm.types import ParamDict

OptState = Any


@dataclass(frozen=True)
class Transform:
    """``init(params) -> state``; ``update(delta, state) -> (step, state)``; pure."""

    init: Callable[[Mapping[str, Tensor]], OptState]
    update: Callable[[Mapping[str, Tensor], OptState], tuple[ParamDict, OptState]]

    def apply(
        self,
        params: Mapping[str, Tensor],
        direction: Mapping[str, Tensor],
        state: OptState,
        held: Mapping[str, Tensor] | None = None,
    ) -> tuple[ParamDict, OptState]:
        """One server step ``w ← w + update(Δ)`` on the ascent ``direction``: the new parameters
        and the new state. ``held`` (bool, each shaped like its parameter): an entry no client
        held keeps its value (the state still advances there)."""
        step, state = self.update(direction, state)
        if held is not None:
            step = {k: torch.where(held[k], s, 0.0) for k, s in step.items()}
        return apply_step(params, step), state


def scale(lr: float) -> Transform:
    """Multiply the direction by ``lr``."""
    return Transform(
        init=lambda p: (),
        update=lambda d, s: ({k: lr * v for k, v in d.items()}, s),
    )


def trace(beta: float, nesterov: bool = False) -> Transform:
    """Heavy-ball momentum ``m ← βm + d`` (PyTorch convention, no dampening)."""

    def init(p: Mapping[str, Tensor]) -> ParamDict:
        return {k: torch.zeros_like(v) for k, v in p.items()}

    def update(d: Mapping[str, Tensor], m: ParamDict) -> tuple[ParamDict, ParamDict]:
        new_m = {k: beta * m[k] + v for k, v in d.items()}
        step = {k: v + beta * new_m[k] for k, v in d.items()} if nesterov else new_m
        return step, new_m

    return Transform(init, update)


def _moments_init(p: Mapping[str, Tensor]) -> tuple[int, ParamDict, ParamDict]:
    """``(count, first moment, second moment)`` at zero, for Adam and Adamax."""
    zeros = {k: torch.zeros_like(v) for k, v in p.items()}
    return 0, zeros, {k: v.clone() for k, v in zeros.items()}


def scale_by_adam(b1: float, b2: float, eps: float, bias_correction: bool = True) -> Transform:
    """Adam direction ``m̂ / (sqrt(v̂) + eps)``; ``eps`` is FedAdam's τ."""

    def update(
        d: Mapping[str, Tensor], s: tuple[int, ParamDict, ParamDict]
    ) -> tuple[ParamDict, tuple[int, ParamDict, ParamDict]]:
        count, mu, nu = s
        count += 1
        mu = {k: b1 * mu[k] + (1 - b1) * v for k, v in d.items()}
        nu = {k: b2 * nu[k] + (1 - b2) * v * v for k, v in d.items()}
        c1 = 1 - b1**count if bias_correction else 1.0
        c2 = 1 - b2**count if bias_correction else 1.0
        step = {k: (mu[k] / c1) / ((nu[k] / c2).sqrt() + eps) for k in d}
        return step, (count, mu, nu)

    return Transform(_moments_init, update)


def scale_by_adamax(b1: float, b2: float, eps: float) -> Transform:
    """Adamax direction ``m̂ / u`` with ``u ← max(b2·u, |d| + eps)`` (Kingma & Ba, 2015;
    eps placed as in :class:`torch.optim.Adamax`)."""

    def update(
        d: Mapping[str, Tensor], s: tuple[int, ParamDict, ParamDict]
    ) -> tuple[ParamDict, tuple[int, ParamDict, ParamDict]]:
        count, mu, u = s
        count += 1
        mu = {k: b1 * mu[k] + (1 - b1) * v for k, v in d.items()}
        u = {k: torch.maximum(b2 * u[k], v.abs() + eps) for k, v in d.items()}
        step = {k: (mu[k] / (1 - b1**count)) / u[k] for k in d}
        return step, (count, mu, u)

    return Transform(_moments_init, update)


def chain(*transforms: Transform) -> Transform:
    """Apply ``transforms`` in order; the state is the tuple of their states."""

    def init(p: Mapping[str, Tensor]) -> tuple[OptState, ...]:
        return tuple(t.init(p) for t in transforms)

    def update(
        d: Mapping[str, Tensor], s: tuple[OptState, ...]
    ) -> tuple[ParamDict, tuple[Any, ...]]:
        new_states = []
        out: Mapping[str, Tensor] = d
        for t, st in zip(transforms, s, strict=True):
            out, st = t.update(out, st)
            new_states.append(st)
        return dict(out), tuple(new_states)

    return Transform(init, update)


def sgd(lr: float = 1.0) -> Transform:
    """FedAvg with server learning rate ``lr`` (``lr=1``: plain model averaging)."""
    return scale(lr)


def momentum(lr: float = 1.0, beta: float = 0.9, nesterov: bool = False) -> Transform:
    """FedAvgM."""
    return chain(trace(beta, nesterov), scale(lr))


def adam(
    lr: float = 1e-3,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    bias_correction: bool = True,
) -> Transform:
    """FedAdam."""
    return chain(scale_by_adam(b1, b2, eps, bias_correction), scale(lr))


def adamax(lr: float = 1e-2, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> Transform:
    """Adamax (FedSparse's server optimizer for the gate parameters)."""
    return chain(scale_by_adamax(b1, b2, eps), scale(lr))


class ServerOptConfig(BaseModel):
    """``server:`` block of an algorithm: which transform the mean delta goes through."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    optimizer: Literal["sgd", "momentum", "adam", "adamax"] = "sgd"
    lr: float = Field(1.0, gt=0, description="server learning rate η_s")
    momentum: float = Field(0.9, ge=0, lt=1, description="FedAvgM β")
    nesterov: bool = False
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.999, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0, description="Adam ε (FedAdam's τ)")
    bias_correction: bool = True

    def build(self) -> Transform:
        if self.optimizer == "sgd":
            return sgd(self.lr)
        if self.optimizer == "momentum":
            return momentum(self.lr, self.momentum, self.nesterov)
        if self.optimizer == "adam":
            return adam(self.lr, self.beta1, self.beta2, self.eps, self.bias_correction)
        return adamax(self.lr, self.beta1, self.beta2, self.eps)


def adam_server() -> ServerOptConfig:
    """Adam at lr 1e-3: the server optimizer Louizos et al. use for every method (the default of
    FedSparse, FedL1, the Laplace and MoG priors' gradient rules) and FedDrop's default."""
    return ServerOptConfig(optimizer="adam", lr=1e-3)


def apply_step(params: Mapping[str, Tensor], step: Mapping[str, Tensor]) -> ParamDict:
    """``w + step`` for every parameter with a step (others unchanged)."""
    return {k: (v + step[k]) if k in step else v for k, v in params.items()}
