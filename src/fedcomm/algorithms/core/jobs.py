"""Local training as data: a client's *job* and the *program* it shares with other clients.

An algorithm that builds its local training as a :class:`LocalJob` (``client_job`` in the
contract) runs on both backends from the same code:

* the sequential backend calls :func:`fedcomm.algorithms.core.sequential.run_job`: eager
  autograd, in-place ``_foreach`` updates, one client at a time;
* the vectorized backend (:mod:`fedcomm.simulation.vectorized`) stacks the jobs of a round that
  share a :class:`LocalProgram` and tensor shapes, and runs them as one batched computation:
  ``torch.func.vmap`` over the gradient phase, the same update rule in place on the stacked
  tensors.

Everything client-specific is a tensor in the job (``live`` trained tensors, ``frozen`` tensors
the hooks read: anchors, masks, penalties' constants), so the program's hooks are pure functions of
``full = frozen | live`` and can be vmapped. Randomness a step needs (FedSparse's gate noise,
FedBIAD's weight noise) is drawn *outside* the step by ``draws()`` from the client's own
generator, in the order the sequential code draws it, and enters the step as frozen tensors:
the same seed gives the same draws on both backends. Dropout masks are drawn the same way, by the
executors, from the client's dropout stream (``LocalJob.dropout``, :mod:`fedcomm.models.dropout`),
and enter the step as frozen tensors the forward pass multiplies by. Host-side logic between
steps (FedBIAD's pattern resampling, FedDST's mid-training readjustment) is ``after_step`` at the
listed steps.

Here: the job (:class:`LocalProgram`, :class:`LocalJob`, :class:`JobResult`, :func:`new_job`) and
the step both executors run (the data loss, :func:`grad_fn`, :func:`apply_update`); the
sequential executor itself is :mod:`fedcomm.algorithms.core.sequential`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm.algorithms.core.context import ClientContext, ClientData, ClientResult
from fedcomm.algorithms.core.sgd import (
    AuxAdamax,
    GradHook,
    LocalConfig,
    LossHook,
    ParamMap,
    _adamax,
    _clipped,
    cross_entropy,
    init_bufs,
    sgd_inplace,
)
from fedcomm.models import dropout
from fedcomm.seeding import Stream, torch_generator
from fedcomm.types import ParamDict

# (live after the update, frozen of the step, live before the step or {}) -> projected live
JobPostStep = Callable[
    [dict[str, Tensor], Mapping[str, Tensor], Mapping[str, Tensor]], dict[str, Tensor]
]
# (step index, the step's data loss, live, frozen, the step's batch indices)
#   -> (live updates, frozen updates) or None; called after the listed steps only
AfterStep = Callable[
    [int, float, Mapping[str, Tensor], Mapping[str, Tensor], Tensor],
    tuple[Mapping[str, Tensor], Mapping[str, Tensor]] | None,
]
# (live, frozen, xb, yb, per-sample weights or None) -> (model grads, aux grads, data loss)
GradFn = Callable[
    [dict[str, Tensor], Mapping[str, Tensor], Tensor, Tensor, Tensor | None],
    tuple[dict[str, Tensor], dict[str, Tensor], Tensor],
]


@dataclass(frozen=True, eq=False)
class LocalProgram:
    """The step rule: what clients training together must share (compared by identity).

    Build it once per algorithm (or per structure), never per client. Hooks read per-client
    tensors from their arguments, never from closures over one client's state.
    """

    loss_hook: LossHook | None = None  # (full, data loss) -> objective
    grad_hook: GradHook | None = None  # (full, grads) -> grads
    post_step: JobPostStep | None = None  # projection after the update (masks)
    post_reads_old: bool = False  # post_step needs the live tensors from before the step
    # full -> forward parameters (w ⊙ z, noise); entries it adds that are neither parameters nor
    # in full (e.g. gate logits) are passed on to loss_hook, so the two share the work
    param_map: ParamMap | None = None
    aux: AuxAdamax | None = None  # auxiliary tensors with their own Adamax
    skip_loss: float | None = None  # a step whose data loss is >= this is not taken
    # (module name, key): the module's input is multiplied by param_map's entry ``key``, a
    # ``(in_features,)`` gate, during the forward pass; for a linear layer the same function
    # as gating its weight's input columns, at the input's size rather than the weight's
    input_gates: tuple[tuple[str, str], ...] = ()
    # a key of what param_map returns: a ``(classes,)`` 1/0 vector; the data loss is then the
    # cross-entropy of a softmax over the kept classes only (:func:`masked_cross_entropy`)
    logit_mask: str | None = None


@dataclass(frozen=True)
class JobResult:
    """A finished job: the trained tensors, the final frozen tensors and optimizer state."""

    live: ParamDict
    frozen: ParamDict
    bufs: ParamDict
    loss: float  # mean data loss over the steps (skipped ones included); NaN without steps
    steps: int


@dataclass
class LocalJob:
    """One client's local training, ready to run on either backend."""

    program: LocalProgram
    live: dict[str, Tensor]  # trained tensors at the start (read-only: executors copy them)
    frozen: dict[str, Tensor]  # per-client tensors read by the hooks (constant unless updated)
    bufs: dict[str, Tensor]  # optimizer state (``_local.init_bufs``); read-only like ``live``
    data: ClientData
    batches: list[Tensor]  # index batches, already drawn from the client's generator
    finish: Callable[[JobResult], ClientResult]
    draws: Callable[[], dict[str, Tensor]] | None = None  # per-step random tensors, in order
    after_step: AfterStep | None = None
    hook_steps: frozenset[int] = field(default_factory=frozenset)
    # the client's dropout stream: the executors draw each step's masks from it before the step
    # (:mod:`fedcomm.models.dropout`); None: dropout layers draw from torch's global generator
    dropout: torch.Generator | None = None


def with_dropout(job: LocalJob, ctx: ClientContext) -> LocalJob:
    """``job`` with the client's dropout stream ``(seed, DROPOUT, round, client)`` when the
    model has dropout layers (both backends set it, so both draw the same masks)."""
    if not dropout.layers(ctx.model):
        return job
    gen = torch_generator(ctx.seed, Stream.DROPOUT, ctx.round_, ctx.client_id)
    return replace(job, dropout=gen)


def unfinished(result: JobResult) -> ClientResult:
    """``finish`` of a job trained directly with :func:`.sequential.train_job` (never called)."""
    raise RuntimeError("this job is trained with train_job and has no client result")


def new_job(
    program: LocalProgram,
    start: Mapping[str, Tensor],
    data: ClientData,
    cfg: LocalConfig,
    batches: list[Tensor],
    finish: Callable[[JobResult], ClientResult],
    *,
    frozen: Mapping[str, Tensor] | None = None,
    bufs: Mapping[str, Tensor] | None = None,
    draws: Callable[[], dict[str, Tensor]] | None = None,
    after_step: AfterStep | None = None,
    hook_steps: frozenset[int] = frozenset(),
) -> LocalJob:
    """A job training from ``start`` (never modified: executors train copies); ``bufs`` (e.g.
    carried momentum) override fresh optimizer state where the keys match."""
    live = {k: v.detach() for k, v in start.items()}
    state = init_bufs(live, cfg, program.aux)
    if bufs is not None:
        state.update({k: v.detach().clone() for k, v in bufs.items() if k in state})
    return LocalJob(
        program,
        live,
        dict(frozen or {}),
        state,
        data,
        batches,
        finish,
        draws,
        after_step,
        hook_steps,
    )


ClientJob = Callable[[Mapping[str, Tensor], Any, ClientData, ClientContext], LocalJob]


def weighted_cross_entropy(logits: Tensor, y: Tensor, w: Tensor) -> Tensor:
    """``Σ_i w_i · CE_i`` with ``CE_i`` the sample's mean over its tokens; with ``w = 1/n`` on
    the ``n`` real samples and 0 on padding this is :func:`cross_entropy` of the real batch."""
    per = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
    return (per.reshape(y.shape[0], -1).mean(1) * w).sum()


DROPPED_LOGIT = -1e4  # added to a dropped class's logit: exp(-1e4) is 0 in fp32


def masked_cross_entropy(logits: Tensor, y: Tensor, keep: Tensor, w: Tensor | None) -> Tensor:
    """Cross-entropy of a softmax over the kept classes only: ``keep`` ``(classes,)`` is 1 for a
    class in the softmax and 0 for one left out (its logit moved to ``DROPPED_LOGIT``, so it takes
    no probability), and a target in a left-out class is left out of the mean (its loss would
    be about 1e4). The mean is over the kept targets; ``w`` (per sample: ``1/n`` on the real
    samples of a padded batch, 0 on padding) weighs each sample's targets, so a padded batch
    gives the real batch's value. None kept gives 0. Shapes stay fixed (vmap)."""
    classes = logits.shape[-1]
    shifted = logits + (1.0 - keep) * DROPPED_LOGIT
    per = F.cross_entropy(shifted.reshape(-1, classes), y.reshape(-1), reduction="none")
    valid = keep[y.reshape(-1)]
    if w is not None:
        valid = valid * w.repeat_interleave(y[0].numel())  # (B·T,) each sample's weight
    return (per * valid).sum() / valid.sum().clamp_min(1e-12)


def grad_fn(
    model: nn.Module,
    program: LocalProgram,
    cfg: LocalConfig,
    *,
    functional: bool,
    bound: bool = False,
) -> GradFn:
    """The gradient phase of a step: data loss, hooks, model-gradient clipping.

    ``functional=True`` is the form vmapped over clients (:func:`torch.func.grad`), ``False`` the
    eager form of the sequential backend (:func:`torch.autograd.grad`). ``bound=True`` (eager
    only, no ``param_map``): ``live`` are leaf tensors the caller has bound into ``model`` for the
    whole job (:func:`.sequential.train_job`), so a step is a plain ``model(xb)``, without
    re-binding the module's parameters every step. The step's dropout masks (``frozen``'s
    :data:`fedcomm.models.dropout.PREFIX` keys) go to the forward pass only, never to the hooks.
    """
    names = frozenset(n for n, _ in model.named_parameters())
    aux_keys = program.aux.keys if program.aux is not None else frozenset()

    def objective(
        live: dict[str, Tensor],
        frozen: Mapping[str, Tensor],
        xb: Tensor,
        yb: Tensor,
        wb: Tensor | None,
        masks: Mapping[str, Tensor],
    ) -> tuple[Tensor, Tensor]:
        full = {**frozen, **live}
        seen = full  # what the loss hook sees: full, plus what param_map computed on the way
        if bound:
            with dropout.given(model, masks):
                logits = model(xb)
        else:
            mapped = program.param_map(full) if program.param_map is not None else full
            forward = {k: v for k, v in mapped.items() if k in names}
            extras = {k: v for k, v in mapped.items() if k not in names and k not in full}
            seen = {**full, **extras} if extras else full
            with _gated_inputs(model, program.input_gates, mapped), dropout.given(model, masks):
                logits = functional_call(model, forward, (xb,))
        if program.logit_mask is not None:
            loss = masked_cross_entropy(logits, yb, seen[program.logit_mask], wb)
        elif wb is None:
            loss = cross_entropy(logits, yb)
        else:
            loss = weighted_cross_entropy(logits, yb, wb)
        total = loss if program.loss_hook is None else program.loss_hook(seen, loss)
        return total, loss

    def raw(
        live: dict[str, Tensor],
        frozen: Mapping[str, Tensor],
        xb: Tensor,
        yb: Tensor,
        wb: Tensor | None,
        masks: Mapping[str, Tensor],
    ) -> tuple[dict[str, Tensor], Tensor]:
        if functional:
            grads, loss = torch.func.grad(objective, has_aux=True)(live, frozen, xb, yb, wb, masks)
            return grads, loss
        leaves = live if bound else {k: v.detach().requires_grad_(True) for k, v in live.items()}
        total, loss = objective(leaves, frozen, xb, yb, wb, masks)
        g = torch.autograd.grad(total, list(leaves.values()))
        return dict(zip(leaves, g, strict=True)), loss

    def phase(
        live: dict[str, Tensor],
        frozen: Mapping[str, Tensor],
        xb: Tensor,
        yb: Tensor,
        wb: Tensor | None,
    ) -> tuple[dict[str, Tensor], dict[str, Tensor], Tensor]:
        masks, frozen = dropout.split(frozen)  # the step's dropout masks ride in frozen
        grads, loss = raw(live, frozen, xb, yb, wb, masks)
        if program.grad_hook is not None:
            grads = program.grad_hook({**frozen, **live}, grads)
        aux_grads = {k: grads.pop(k) for k in aux_keys}
        return _clipped(grads, cfg), aux_grads, loss.detach()

    return phase


@contextmanager
def _gated_inputs(
    model: nn.Module, gates: tuple[tuple[str, str], ...], mapped: Mapping[str, Tensor]
) -> Iterator[None]:
    """For the forward pass: each named module's input times its gate (``x ⊙ z`` along the last
    dimension), through forward pre-hooks removed afterwards."""
    if not gates:
        yield
        return

    def hook(z: Tensor) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...]]:
        return lambda module, args: (args[0] * z, *args[1:])

    handles = [
        model.get_submodule(name).register_forward_pre_hook(hook(mapped[key]))
        for name, key in gates
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def apply_update(
    live: dict[str, Tensor],
    bufs: dict[str, Tensor],
    grads: Mapping[str, Tensor],
    aux_grads: Mapping[str, Tensor],
    cfg: LocalConfig,
    aux: AuxAdamax | None,
) -> None:
    """The update of :func:`.local.make_step` on (clipped) gradients, in place
    on ``live`` and ``bufs``: ``g ← g + wd·w; b ← μb + g; w ← w − lr·b`` for the model tensors,
    Adamax for ``aux``'s. Elementwise, so the same call serves one client or a stacked chunk
    (Adamax's step count then has one entry per client)."""
    sgd_inplace(live, bufs, grads, cfg)
    if aux is not None and aux_grads:
        new_live, new_bufs = _adamax({k: live[k] for k in aux_grads}, dict(aux_grads), bufs, aux)
        live.update(new_live)
        bufs.update(new_bufs)
