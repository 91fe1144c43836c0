"""The local step rule every algorithm composes: config, batches, hooks and the SGD update.

Local training is written as a function of ``(model structure, params, data, config,
generator)`` with parameters passed explicitly through :func:`torch.func.functional_call`, so
the model object is never mutated and the vectorized backend can batch the same algorithms
(:mod:`fedcomm.algorithms.core.jobs`).
Algorithms vary it through hooks, never by copying it:

* ``loss_hook(params, loss) -> loss``  extra terms of the local objective (e.g. L1 on groups);
* ``grad_hook(params, grads) -> grads`` gradient corrections (FedProx's ``μ(w - w_t)``);
* ``post_step(params) -> None``         in-place projections after each step (masks);
* ``skip_loss``                         skip a step whose minibatch loss is >= this value (the
  ProgFed code's divergence guard), leaving parameters and optimizer state unchanged.

SGD with optional momentum and weight decay follows :class:`torch.optim.SGD` exactly
(``g ← g + wd·w; b ← μb + g; w ← w − lr·b``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm.types import ParamDict

LossHook = Callable[[Mapping[str, Tensor], Tensor], Tensor]
GradHook = Callable[[Mapping[str, Tensor], dict[str, Tensor]], dict[str, Tensor]]
PostStep = Callable[[dict[str, Tensor]], dict[str, Tensor]]  # params -> projected params
GradHookFactory = Callable[[Mapping[str, Tensor]], GradHook]  # anchor (w_t) -> hook
ParamMap = Callable[[dict[str, Tensor]], dict[str, Tensor]]  # trained tensors -> forward params
StepFn = Callable[
    [dict[str, Tensor], dict[str, Tensor], Mapping[str, Tensor], Tensor, Tensor],
    tuple[dict[str, Tensor], dict[str, Tensor], Tensor],
]


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
class AuxAdamax:
    """Auxiliary trained tensors (e.g. FedSparse's gate parameters ``v``) with their own Adamax
    (Kingma & Ba 2015, as :class:`torch.optim.Adamax`), fresh at the start of local training.

    They travel in the same ``params`` dict under ``keys`` and are not model parameters: a
    ``param_map`` turns the whole dict into the forward pass's model parameters.
    """

    keys: frozenset[str]
    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    rule: Literal["adamax", "sgd"] = "adamax"  # sgd: plain ``v ← v − lr·g`` (an ablation)


@dataclass(frozen=True)
class LocalResult:
    params: ParamDict
    loss: float  # mean training loss over the steps taken
    steps: int
    bufs: dict[str, Tensor] = field(default_factory=dict)  # optimizer state at the end


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
        perm = torch.randperm(n, generator=generator, device=generator.device)
        batches.extend(perm.split(cfg.batch_size))
    return batches if cfg.steps is None else batches[: cfg.steps]


def make_step(
    model: nn.Module,
    cfg: LocalConfig,
    *,
    loss_hook: LossHook | None = None,
    grad_hook: GradHook | None = None,
    post_step: PostStep | None = None,
    param_map: ParamMap | None = None,
    aux: AuxAdamax | None = None,
    functional: bool = True,
    skip_loss: float | None = None,
) -> StepFn:
    """One SGD step ``(live, bufs, frozen, xb, yb) -> (live, bufs, data loss)``.

    ``live`` are the trained tensors, ``bufs`` the optimizer state as tensors (SGD momentum
    buffers under the parameter names; ``aux`` Adamax moments under ``adamax.*`` keys; start
    from :func:`init_bufs`), ``frozen`` tensors used but not trained. ``param_map`` turns the
    trained tensors into the model parameters of the forward pass (default: the model's own
    parameters, as they are) — e.g. ``w ⊙ z`` with gates ``z`` sampled from auxiliary tensors.

    ``functional=True`` (the form a vectorized backend ``torch.func.vmap``-s over clients):
    gradients from :func:`torch.func.grad`, every update returns new tensors, nothing leaves the
    tensor world. ``functional=False``: the same objective, hooks and update rule with eager
    autograd and in-place ``_foreach`` updates of ``live``/``bufs``, which the caller must own.
    Tests check both agree. The backends run :mod:`.jobs` (the same rule, with
    per-client tensors as data); :func:`local_sgd` is its sequential executor.
    """

    names = frozenset(n for n, _ in model.named_parameters())
    aux_keys = aux.keys if aux is not None else frozenset()

    def objective(
        live: dict[str, Tensor], frozen: Mapping[str, Tensor], xb: Tensor, yb: Tensor
    ) -> tuple[Tensor, Tensor]:
        full = {**frozen, **live}
        forward = param_map(full) if param_map is not None else full
        forward = {k: v for k, v in forward.items() if k in names}
        loss = cross_entropy(functional_call(model, forward, (xb,)), yb)
        total = loss if loss_hook is None else loss_hook(full, loss)
        return total, loss

    def eager_grad(
        live: dict[str, Tensor], frozen: Mapping[str, Tensor], xb: Tensor, yb: Tensor
    ) -> tuple[dict[str, Tensor], Tensor]:
        leaves = {k: v.detach().requires_grad_(True) for k, v in live.items()}
        total, loss = objective(leaves, frozen, xb, yb)
        grads = torch.autograd.grad(total, list(leaves.values()))
        return dict(zip(leaves, grads, strict=True)), loss

    grad_fn: Callable[..., tuple[dict[str, Tensor], Tensor]] = (
        torch.func.grad(objective, has_aux=True) if functional else eager_grad
    )

    def step(
        live: dict[str, Tensor],
        bufs: dict[str, Tensor],
        frozen: Mapping[str, Tensor],
        xb: Tensor,
        yb: Tensor,
    ) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor]:
        grads, loss = grad_fn(live, frozen, xb, yb)
        if skip_loss is not None and not functional and float(loss.detach()) >= skip_loss:
            return live, bufs, loss.detach()  # a diverging step is not taken (eager form)
        old = (live, bufs) if skip_loss is not None and functional else None
        if grad_hook is not None:
            grads = grad_hook({**frozen, **live}, grads)
        aux_live = {k: live[k] for k in aux_keys}
        aux_grads = {k: grads.pop(k) for k in aux_keys}
        model_live = {k: v for k, v in live.items() if k not in aux_keys}
        model_bufs = {k: v for k, v in bufs.items() if not k.startswith("adamax.")}
        update = _update if functional else _update_inplace
        model_live, model_bufs = update(model_live, grads, model_bufs, cfg)
        if aux is not None:
            aux_live, aux_bufs = _adamax(aux_live, aux_grads, bufs, aux)
            model_bufs = {**model_bufs, **aux_bufs}
        live, bufs = {**model_live, **aux_live}, model_bufs
        if post_step is not None:
            live = post_step(live)
        if old is not None and skip_loss is not None:  # functional form of the same guard
            take = loss.detach() < skip_loss
            live = {k: torch.where(take, v, old[0][k]) for k, v in live.items()}
            bufs = {k: torch.where(take, v, old[1][k]) for k, v in bufs.items()}
        return live, bufs, loss.detach()

    return step


def init_bufs(
    live: Mapping[str, Tensor], cfg: LocalConfig, aux: AuxAdamax | None
) -> dict[str, Tensor]:
    """Fresh optimizer state for :func:`make_step`: momentum buffers and Adamax moments."""
    aux_keys = aux.keys if aux is not None else frozenset()
    bufs = (
        {k: torch.zeros_like(v) for k, v in live.items() if k not in aux_keys}
        if cfg.momentum > 0
        else {}
    )
    for k in sorted(aux_keys):
        bufs[f"adamax.m.{k}"] = torch.zeros_like(live[k])
        bufs[f"adamax.u.{k}"] = torch.zeros_like(live[k])
    if aux_keys:
        bufs["adamax.t"] = torch.zeros((), device=next(iter(live.values())).device)
    return bufs


def _adamax(
    live: dict[str, Tensor], grads: dict[str, Tensor], bufs: Mapping[str, Tensor], aux: AuxAdamax
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """One Adamax step (torch.optim.Adamax's rule), out of place; moments under ``adamax.*``.
    With ``aux.rule == "sgd"`` a plain gradient step instead (the moments stay as they are)."""
    if aux.rule == "sgd":
        return {k: live[k] - aux.lr * g for k, g in grads.items()}, dict(bufs)
    t = bufs["adamax.t"] + 1
    new_live: dict[str, Tensor] = {}
    new_bufs: dict[str, Tensor] = {"adamax.t": t}
    for k, g in grads.items():
        m = aux.b1 * bufs[f"adamax.m.{k}"] + (1 - aux.b1) * g
        u = torch.maximum(aux.b2 * bufs[f"adamax.u.{k}"], g.abs() + aux.eps)
        scale = aux.lr / (1 - aux.b1**t)  # () per client; (C,) for a stacked chunk
        new_live[k] = live[k] - scale.reshape(scale.shape + (1,) * (g.dim() - scale.dim())) * m / u
        new_bufs[f"adamax.m.{k}"], new_bufs[f"adamax.u.{k}"] = m, u
    return new_live, new_bufs


def _clipped(grads: dict[str, Tensor], cfg: LocalConfig) -> dict[str, Tensor]:
    if cfg.clip_grad_norm is None:
        return grads
    norms = torch.stack([torch.linalg.vector_norm(g) for g in grads.values()])
    factor = torch.clamp(cfg.clip_grad_norm / (torch.linalg.vector_norm(norms) + 1e-6), max=1.0)
    return {k: g * factor for k, g in grads.items()}


def _update(
    live: dict[str, Tensor], grads: dict[str, Tensor], bufs: dict[str, Tensor], cfg: LocalConfig
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``g ← clip(g) + wd·w; b ← μb + g; w ← w − lr·b`` (torch.optim.SGD), out of place."""
    grads = _clipped(grads, cfg)
    if cfg.weight_decay:
        grads = {k: g + cfg.weight_decay * live[k] for k, g in grads.items()}
    if cfg.momentum > 0:
        bufs = {k: cfg.momentum * bufs[k] + g for k, g in grads.items()}
        grads = bufs
    return {k: w - cfg.lr * grads[k] for k, w in live.items()}, bufs


@torch.no_grad()
def _update_inplace(
    live: dict[str, Tensor], grads: dict[str, Tensor], bufs: dict[str, Tensor], cfg: LocalConfig
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """The same rule as :func:`_update`, in place on ``live`` and ``bufs``."""
    sgd_inplace(live, bufs, _clipped(grads, cfg), cfg)
    return live, bufs


@torch.no_grad()
def sgd_inplace(
    live: Mapping[str, Tensor],
    bufs: Mapping[str, Tensor],
    grads: Mapping[str, Tensor],
    cfg: LocalConfig,
) -> None:
    """``g ← g + wd·w; b ← μb + g; w ← w − lr·b`` in place for the tensors named in ``grads``
    (already clipped). Elementwise: one client's tensors or a stacked chunk alike."""
    names = list(grads)
    if not names:
        return
    ws, gs = [live[k] for k in names], [grads[k] for k in names]
    if cfg.weight_decay:
        gs = list(torch._foreach_add(gs, ws, alpha=cfg.weight_decay))
    if cfg.momentum > 0:
        bs = [bufs[k] for k in names]
        torch._foreach_mul_(bs, cfg.momentum)
        torch._foreach_add_(bs, gs)
        gs = bs
    torch._foreach_add_(ws, gs, alpha=-cfg.lr)
