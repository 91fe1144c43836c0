"""The sequential executor: a client's local-training job run one step after the other.

Eager autograd and in-place ``_foreach`` updates, one client at a time, over the step of
:mod:`fedcomm.algorithms.core.jobs` (:func:`~fedcomm.algorithms.core.jobs.grad_fn`,
:func:`~fedcomm.algorithms.core.jobs.apply_update`) that the vectorized executor
(:mod:`fedcomm.simulation.vectorized`) runs batched across a round's clients.
:func:`job_client_update` makes an algorithm's ``client_update`` from its ``client_job``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils.stateless import _reparametrize_module

from fedcomm.algorithms.core.context import ClientContext, ClientData, ClientResult
from fedcomm.algorithms.core.jobs import (
    ClientJob,
    JobResult,
    LocalJob,
    apply_update,
    grad_fn,
    with_dropout,
)
from fedcomm.algorithms.core.sgd import LocalConfig
from fedcomm.models import dropout


def run_job(job: LocalJob, model: nn.Module, cfg: LocalConfig) -> ClientResult:
    """Run one job on the sequential backend and finish it."""
    return job.finish(train_job(job, model, cfg))


def train_job(job: LocalJob, model: nn.Module, cfg: LocalConfig) -> JobResult:
    """The sequential executor: one step after the other, eager autograd, in-place updates.

    Without a ``param_map`` the trained tensors are leaves bound into ``model`` once for the job
    (the module's parameters are swapped back afterwards) and updated in place, so a step costs a
    plain forward and backward; results equal the per-step :func:`functional_call` form's.
    """
    program = job.program
    names = {n for n, _ in model.named_parameters()}
    bound = program.param_map is None and set(job.live) <= names and not names & set(job.frozen)
    live = {k: v.clone() for k, v in job.live.items()}
    bufs = {k: v.clone() for k, v in job.bufs.items()}
    if not bound:
        return _steps(job, model, cfg, live, bufs, bound=False)
    live = {k: v.requires_grad_(True) for k, v in live.items()}
    with _reparametrize_module(model, live, tie_weights=True):  # as functional_call ties
        res = _steps(job, model, cfg, live, bufs, bound=True)
    return replace(res, live={k: v.detach() for k, v in res.live.items()})


def _steps(
    job: LocalJob,
    model: nn.Module,
    cfg: LocalConfig,
    live: dict[str, Tensor],
    bufs: dict[str, Tensor],
    *,
    bound: bool,
) -> JobResult:
    """The steps of :func:`train_job`; with ``bound`` the ``live`` leaves are updated in place
    (projections and hook updates are copied into them)."""
    program = job.program
    phase = grad_fn(model, program, cfg, functional=False, bound=bound)
    frozen = job.frozen
    plan = dropout.sites(model, job.data.x[:1]) if job.dropout is not None else ()
    losses: list[Tensor] = []
    for i, idx in enumerate(job.batches):
        step_frozen = {**frozen, **job.draws()} if job.draws is not None else frozen
        xb = job.data.x[idx]
        masks = _masks(plan, len(idx), job.dropout, xb.device)
        grads, aux_grads, loss = phase(
            live, {**step_frozen, **masks} if masks else step_frozen, xb, job.data.y[idx], None
        )
        losses.append(loss)
        if program.skip_loss is None or float(loss) < program.skip_loss:
            before = (
                {k: v.detach().clone() for k, v in live.items()} if program.post_reads_old else {}
            )
            apply_update(live, bufs, grads, aux_grads, cfg, program.aux)
            if program.post_step is not None:
                with torch.no_grad():
                    projected = program.post_step(live, step_frozen, before)
                live = _assign(live, projected, bound)
        if job.after_step is not None and i in job.hook_steps:
            view = {k: v.detach() for k, v in live.items()}
            updates = job.after_step(i, float(loss), view, frozen, idx)
            if updates is not None:
                live = _assign(live, {k: v.clone() for k, v in updates[0].items()}, bound)
                frozen = {**frozen, **updates[1]}
    mean = float(torch.stack(losses).mean()) if losses else float("nan")
    return JobResult(live, frozen, bufs, mean, len(losses))


def _masks(
    plan: tuple[dropout.Site, ...], rows: int, gen: torch.Generator | None, device: torch.device
) -> dict[str, Tensor]:
    """A step's dropout masks from the job's stream, on ``device`` (none without a plan)."""
    if not plan or gen is None:
        return {}
    return {k: v.to(device) for k, v in dropout.draw(plan, rows, gen).items()}


@torch.no_grad()
def _assign(live: dict[str, Tensor], new: Mapping[str, Tensor], bound: bool) -> dict[str, Tensor]:
    """``live`` with ``new`` values: copied into the bound leaves, else replacing them."""
    if not bound:
        return {**live, **new}
    for k, v in new.items():
        if v is not live[k]:
            live[k].copy_(v)
    return live


def job_client_update(
    client_job: ClientJob,
) -> Callable[[Mapping[str, Tensor], Any, ClientData, ClientContext], ClientResult]:
    """``client_update`` of an algorithm defined by its ``client_job``: the job run sequentially
    on the context's model."""

    def client_update(
        down: Mapping[str, Tensor], cstate: Any, data: ClientData, ctx: ClientContext
    ) -> ClientResult:
        job = with_dropout(client_job(down, cstate, data, ctx), ctx)
        return run_job(job, ctx.model, ctx.local)

    return client_update
