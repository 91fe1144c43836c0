"""ProgFed's local run: local SGD on the active sub-model ``M^s`` (Algorithm 1, lines 16-23),
with the client's own dropout stream and, optionally, momentum kept per trained set.

Client momentum is fresh every round (``client_momentum: reset``, the default: Algorithm 1's
local SGD keeps no state between rounds) or kept per client until the trained set changes
(``persistent``, as the code's ``VirtualWorker.opt``): :class:`ClientState` remembers which
``(stage, warmup)`` its buffers belong to. Dropout (the EMNIST ConvNet's) draws from torch's
global generator, reseeded per client and round from the run's algorithm stream, so a client's
round replays exactly.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

import torch
from torch import Tensor

from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.context import ClientContext, ClientData
from fedcomm.algorithms.progfed.schedule import Phase
from fedcomm.models.progressive import ProgressiveNet
from fedcomm.seeding import Stream, torch_generator
from fedcomm.types import ParamDict


@dataclass(frozen=True)
class ClientState:
    key: tuple[int, bool]  # (stage, warmup) the momentum buffers belong to
    bufs: ParamDict


def momentum_bufs(cstate: ClientState | None, ph: Phase) -> ParamDict | None:
    """``client_momentum: persistent``: the client's buffers while the trained set is the one
    they belong to (the code's ``VirtualWorker.opt``), else fresh (None)."""
    if cstate is None or cstate.key != (ph.stage, ph.warmup):
        return None
    return cstate.bufs


def dropout_seed(ctx: ClientContext) -> int:
    """Seed of the global generator for the client's dropout (the EMNIST ConvNet's), drawn
    from the client's own replayable stream, not ``ctx.generator``."""
    drop = torch_generator(ctx.seed, Stream.ALGORITHM, ctx.round_, ctx.client_id)
    return int(torch.randint(0, 2**62, (1,), generator=drop, device=drop.device))


def local_run(
    net: ProgressiveNet,
    ph: Phase,
    down: Mapping[str, Tensor],
    data: ClientData,
    ctx: ClientContext,
    *,
    lr: float,
    keys: Set[str],
    grad_hook: _local.GradHook | None,
    skip_loss: float | None,
    bufs: ParamDict | None,
) -> _local.LocalResult:
    """Local SGD on ``M^s`` from ``down`` at rate ``lr``, training only ``keys`` (the rest of
    ``down`` frozen), skipping steps whose loss is ``≥ skip_loss``, from momentum ``bufs``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(dropout_seed(ctx))
        return _local.local_sgd(
            net.at_stage(ph.stage),
            down,
            data,
            ctx.local.model_copy(update={"lr": lr}),
            ctx.generator,
            grad_hook=grad_hook,
            trainable={k: k in keys for k in down},
            skip_loss=skip_loss,
            bufs=bufs,
        )
