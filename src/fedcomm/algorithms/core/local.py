"""The one local-training loop every algorithm composes: :func:`local_sgd`.

It runs a client's local SGD as a job (:mod:`fedcomm.algorithms.core.jobs`) on the sequential
executor (:mod:`fedcomm.algorithms.core.sequential`) over the step rule of
:mod:`fedcomm.algorithms.core.sgd`. Algorithms vary it through hooks, never by copying it:

* ``loss_hook(params, loss) -> loss``  extra terms of the local objective (e.g. L1 on groups);
* ``grad_hook(params, grads) -> grads`` gradient corrections (FedProx's ``μ(w - w_t)``);
* ``post_step(params) -> None``         in-place projections after each step (masks);
* ``skip_loss``                         skip a step whose minibatch loss is >= this value (the
  ProgFed code's divergence guard), leaving parameters and optimizer state unchanged.

The step rule's names (``LocalConfig``, ``batch_schedule``, the hook types, ...) are re-exported
here: ``_local`` is the one import an algorithm needs for local training.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core.context import ClientData
from fedcomm.algorithms.core.sequential import train_job
from fedcomm.algorithms.core.sgd import (
    AuxAdamax,
    GradHook,
    GradHookFactory,
    LocalConfig,
    LocalResult,
    LossHook,
    ParamMap,
    PostStep,
    StepFn,
    batch_schedule,
    cross_entropy,
    init_bufs,
    make_step,
    sgd_inplace,
)

__all__ = [
    "AuxAdamax",
    "GradHook",
    "GradHookFactory",
    "LocalConfig",
    "LocalResult",
    "LossHook",
    "ParamMap",
    "PostStep",
    "StepFn",
    "batch_schedule",
    "cross_entropy",
    "init_bufs",
    "local_sgd",
    "make_step",
    "sgd_inplace",
]


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
    param_map: ParamMap | None = None,
    aux: AuxAdamax | None = None,
    skip_loss: float | None = None,
    bufs: Mapping[str, Tensor] | None = None,
) -> LocalResult:
    """Run local SGD from ``params`` on ``data``; returns new detached params and the mean loss.

    ``trainable`` may freeze parameters by name (they are still used in the forward pass).
    The steps are the sequential executor's
    (:func:`fedcomm.algorithms.core.sequential.train_job`) over the batches of
    :func:`batch_schedule`. ``bufs`` is the optimizer state to start from (e.g. a client's
    persistent momentum; default: fresh); the state at the end is returned in
    :attr:`LocalResult.bufs`. The mean loss covers every minibatch, including steps skipped by
    ``skip_loss``.
    """
    project = post_step
    program = _jobs.LocalProgram(
        loss_hook=loss_hook,
        grad_hook=grad_hook,
        post_step=(lambda live, frozen, before: project(live)) if project is not None else None,
        param_map=param_map,
        aux=aux,
        skip_loss=skip_loss,
    )
    frozen = {
        k: v.detach()
        for k, v in params.items()
        if trainable is not None and not trainable.get(k, True)
    }
    live = {k: v for k, v in params.items() if k not in frozen}
    batches = batch_schedule(data.num_examples, cfg, generator)
    job = _jobs.new_job(
        program, live, data, cfg, batches, _jobs.unfinished, frozen=frozen, bufs=bufs
    )
    res = train_job(job, model, cfg)
    out = {k: (res.live[k] if k in res.live else frozen[k]) for k in params}
    return LocalResult(out, res.loss, res.steps, res.bufs)
