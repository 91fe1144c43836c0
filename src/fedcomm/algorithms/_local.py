"""The one local-training loop every algorithm composes.

Local training is written as a function of ``(model structure, params, data, config,
generator)`` with parameters passed explicitly through :func:`torch.func.functional_call`, so
the model object is never mutated and a later vectorized backend can batch the same algorithms.
Algorithms vary it through hooks, never by copying it:

* ``loss_hook(params, loss) -> loss``  extra terms of the local objective (e.g. L1 on groups);
* ``grad_hook(params, grads) -> grads`` gradient corrections (FedProx's ``μ(w - w_t)``);
* ``post_step(params) -> None``         in-place projections after each step (masks).

SGD with optional momentum and weight decay follows :class:`torch.optim.SGD` exactly
(``g ← g + wd·w; b ← μb + g; w ← w − lr·b``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm.types import Params

if TYPE_CHECKING:
    from fedcomm.algorithms.base import ClientData

LossHook = Callable[[Mapping[str, Tensor], Tensor], Tensor]
GradHook = Callable[[Mapping[str, Tensor], dict[str, Tensor]], dict[str, Tensor]]
PostStep = Callable[[dict[str, Tensor]], None]
GradHookFactory = Callable[[Mapping[str, Tensor]], GradHook]  # anchor (w_t) -> hook


class LocalConfig(BaseModel):
    """``train.local``: client-side optimisation (identical for every algorithm of a run)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    epochs: int | None = Field(
        None, ge=1, description="local epochs (default 1; exclusive with steps)"
    )
    steps: int | None = Field(None, ge=1, description="local SGD steps (exclusive with epochs)")
    batch_size: int = Field(32, ge=1)
    lr: float = Field(0.05, gt=0)
    momentum: float = Field(0.0, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    clip_grad_norm: float | None = Field(
        None, gt=0, description="max global grad norm, off if null"
    )

    @model_validator(mode="before")
    @classmethod
    def _default_one_epoch(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("epochs") is None and data.get("steps") is None:
            return {**data, "epochs": 1}
        return data

    @model_validator(mode="after")
    def _epochs_xor_steps(self) -> LocalConfig:
        if self.epochs is not None and self.steps is not None:
            raise ValueError(
                "set exactly one of epochs and steps "
                f"(got epochs={self.epochs}, steps={self.steps})"
            )
        return self


@dataclass(frozen=True)
class LocalResult:
    params: Params
    loss: float  # mean training loss over the steps taken
    steps: int


def cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    """Mean cross-entropy; sequence logits ``(B, T, V)`` are flattened over tokens."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def batch_schedule(n: int, cfg: LocalConfig, generator: torch.Generator) -> list[Tensor]:
    """Index batches of one client's local training: shuffled each epoch, last batch partial.

    With ``steps`` the epochs are chained and cut after ``steps`` batches.
    """
    if n == 0:
        return []
    per_epoch = math.ceil(n / cfg.batch_size)
    epochs = cfg.epochs if cfg.epochs is not None else math.ceil((cfg.steps or 0) / per_epoch)
    batches: list[Tensor] = []
    for _ in range(epochs):
        perm = torch.randperm(n, generator=generator)
        batches.extend(perm.split(cfg.batch_size))
    return batches if cfg.steps is None else batches[: cfg.steps]


def local_sgd(
    model: nn.Module,
    params: Mapping[str, Tensor],
    data: ClientData,
    cfg: LocalConfig,
    generator: torch.Generator,
    *,
    loss_hook: LossHook | None = None,
    grad_hook: GradHook | None = None,
    post_step: PostStep | None = None,
    trainable: Mapping[str, bool] | None = None,
) -> LocalResult:
    """Run local SGD from ``params`` on ``data``; returns new detached params and the mean loss.

    ``trainable`` may freeze parameters by name (they are still used in the forward pass).
    """
    names = [k for k in params if trainable is None or trainable.get(k, True)]
    frozen = {k: v.detach() for k, v in params.items() if k not in names}
    live = {k: params[k].detach().clone().requires_grad_(True) for k in names}
    bufs = {k: torch.zeros_like(v) for k, v in live.items()} if cfg.momentum > 0 else {}
    losses: list[Tensor] = []
    for idx in batch_schedule(data.num_examples, cfg, generator):
        full = {**frozen, **live}
        loss = cross_entropy(functional_call(model, full, (data.x[idx],)), data.y[idx])
        total = loss if loss_hook is None else loss_hook(full, loss)
        grads = dict(zip(names, torch.autograd.grad(total, [live[k] for k in names]), strict=True))
        if grad_hook is not None:
            grads = grad_hook(full, grads)
        _sgd_step(live, grads, bufs, cfg)
        if post_step is not None:
            with torch.no_grad():
                post_step(live)
        losses.append(loss.detach())
    mean_loss = float(torch.stack(losses).mean()) if losses else float("nan")
    out = {k: (live[k].detach() if k in live else frozen[k]) for k in params}
    return LocalResult(out, mean_loss, len(losses))


@torch.no_grad()
def _sgd_step(
    live: dict[str, Tensor], grads: dict[str, Tensor], bufs: dict[str, Tensor], cfg: LocalConfig
) -> None:
    if cfg.clip_grad_norm is not None:
        norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])
        )
        factor = min(1.0, cfg.clip_grad_norm / (float(norm) + 1e-6))
        grads = {k: g * factor for k, g in grads.items()}
    for k, w in live.items():
        g = grads[k]
        if cfg.weight_decay:
            g = g.add(w, alpha=cfg.weight_decay)
        if cfg.momentum > 0:
            bufs[k].mul_(cfg.momentum).add_(g)
            g = bufs[k]
        w.sub_(g, alpha=cfg.lr)
