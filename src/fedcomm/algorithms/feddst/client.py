"""FedDST's client mechanics: a masked job, where it readjusts, the dense gradient, the upload.

A client trains ``θ ⊙ m`` as a :class:`~fedcomm.algorithms.core.jobs.LocalJob` (so both backends run
it): the client's masks ride in the job's frozen tensors under :data:`MASK` and the program's
``post_step`` zeroes the masked-out weights after every step. In a readjustment round the job
calls an ``after_step`` hook after batch :func:`readjust_batch`, where FedDST takes the dense
gradient (:func:`ce_grads`) and readjusts; the hook's frozen update replaces the masks.
:func:`finish` uploads ``(θ_k ⊙ m_k, m_k)`` (costs: :mod:`fedcomm.algorithms.feddst.comm`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm.algorithms.core import ClientContext, ClientData, ClientResult
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.reuse import Reused
from fedcomm.algorithms.sparse import churn
from fedcomm.algorithms.sparse import codec as _codec
from fedcomm.algorithms.sparse import masks as _masks
from fedcomm.models import dropout
from fedcomm.types import ParamDict

MASK = "mask."  # a client's current masks in its job's frozen tensors


@dataclass(frozen=True)
class ClientState:
    mask_digest: str | None = None  # of the client's current mask; None = all ones (never seen)


def frozen_masks(masks: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The masks as a job's frozen tensors."""
    return {MASK + k: m for k, m in masks.items()}


def masks_of(frozen: Mapping[str, Tensor], names: Sequence[str]) -> _masks.Masks:
    """The masks ``names`` held in a job's frozen tensors."""
    return {k: frozen[MASK + k] for k in names}


def _masked_post(
    live: dict[str, Tensor], frozen: Mapping[str, Tensor], before: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """``θ ← θ ⊙ m`` after every step (the masks are per client, read from ``frozen``)."""
    return {
        k: torch.where(frozen[MASK + k], v, 0.0) if MASK + k in frozen else v
        for k, v in live.items()
    }


@dataclass
class ClientShared:
    """What one algorithm's clients share: the step rule (compared by identity when jobs are
    batched) and the work every client would repeat on the same downlink."""

    program: _jobs.LocalProgram = field(
        default_factory=lambda: _jobs.LocalProgram(post_step=_masked_post)
    )
    decoded: Reused[tuple[ParamDict, _masks.Masks]] = field(default_factory=Reused)  # the downlink
    digests: Reused[str] = field(default_factory=Reused)  # the last mask set hashed

    def downlink(self, down: Mapping[str, Tensor]) -> tuple[ParamDict, _masks.Masks]:
        """The global ``(θ ⊙ m, m)``, decoded once per round."""
        return self.decoded.get(list(down.values()), lambda: _codec.decode(down))


def readjust_batch(num_batches: int, per_epoch: int, at_epoch: int | None) -> int:
    """Index of the batch after which to readjust: the end of local epoch ``at_epoch`` (0-based;
    None or past the end: the last batch)."""
    last = num_batches - 1
    return last if at_epoch is None else min(last, (at_epoch + 1) * per_epoch - 1)


def plan(
    data: ClientData, ctx: ClientContext, readjust: bool, at_epoch: int | None
) -> tuple[list[Tensor], int]:
    """The client's minibatches and the index of the one after which it readjusts (-1: none;
    a client without data never readjusts)."""
    batches = _local.batch_schedule(data.num_examples, ctx.local, ctx.generator)
    if not readjust or data.num_examples <= 0:
        return batches, -1
    per_epoch = math.ceil(data.num_examples / ctx.local.batch_size) if batches else 1
    return batches, readjust_batch(len(batches), per_epoch, at_epoch)


def ce_grads(
    model: nn.Module, params: Mapping[str, Tensor], names: Sequence[str], x: Tensor, y: Tensor
) -> dict[str, Tensor]:
    """Dense gradient of plain mean CE w.r.t. the ``names`` tensors (masked entries included)."""
    leaves = {k: params[k].detach().requires_grad_(True) for k in names}
    with dropout.disabled(model):  # a measurement: the whole network, no draw
        logits = functional_call(model, {**params, **leaves}, (x,))
    grads = torch.autograd.grad(_local.cross_entropy(logits, y), list(leaves.values()))
    return dict(zip(leaves, grads, strict=True))


def finish(
    name: str,
    upload_mask: _codec.MaskCharge | None,
    shared: ClientShared,
    start: _masks.Masks,
    data: ClientData,
    res: _jobs.JobResult,
) -> ClientResult:
    """Upload ``(θ_k ⊙ m_k, m_k)``, the mask charged per ``upload_mask`` if the client
    readjusted (else ``None``: the server knows it) and its churn logged."""
    final = {k: v.detach() for k, v in res.live.items()}
    now = masks_of(res.frozen, list(start))
    metrics = {"train/loss": res.loss}
    if upload_mask is not None:
        metrics[f"{name}/client_churn"] = churn(start, now)
    return ClientResult(
        uplink=_codec.encode(final, now, upload_mask or "known"),
        state=ClientState(shared.digests.get(list(now.values()), lambda: _masks.digest(now))),
        local_params=final,
        num_examples=data.num_examples,
        metrics=metrics,
    )
