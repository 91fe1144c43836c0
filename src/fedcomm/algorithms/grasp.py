"""GraSP: a fixed mask pruned at initialisation on one client's data, then FedDST's training.

Wang, Zhang and Grosse, "Picking Winning Tickets Before Training by Preserving Gradient Flow",
ICLR 2020 (arXiv:2002.07376); the FedDST baseline "GraSP" (Bibikar et al., AAAI 2022), which
runs Synaptic-Flow's GraSP pruner (Tanaka et al., NeurIPS 2020) with global scope and one
iteration on the first client's training data (bibikar/feddst @ 25d6184, its ``--grasp``).

Before round 1 (``warm_start``), on client ``c`` (``client: first`` = client 0, as the code;
``random``: one drawn from the warm-start generator) and the maskable weights ``θ`` of the
initial model (biases held fixed):

* ``g = Σ_b ∇_θ L_b(θ)`` over the client's minibatches (``train.local.batch_size``, in order),
  ``L_b`` = mean CE of the logits divided by ``temperature`` (200, as Synflow);
* ``Hg = Σ_b ∇_θ (∇_θ L_b(θ) · stop(g))`` (double backprop);
* score ``S(−θ) = −θ ⊙ Hg``; GraSP removes the largest scores, i.e. keeps the smallest.

``scope: global`` (GraSP's, default) keeps the ``round((1 − S)·N_m)`` smallest scores over all
layers (exactly density ``1 − S``; a layer may lose all its weights, as in GraSP); ``layer``
keeps the ``k_l(S)`` smallest per layer (``distribution``'s budgets). The server's budgets are
then the mask's own per-layer counts, so the mask stays fixed and training is RandomMask's
(:func:`fedcomm.algorithms.feddst.make` with no readjustment).

The code's density bug (the paper does not state GraSP's density): Synflow reads ``sparsity``
as the *kept* fraction, so ``--sparsity 0.8`` gives a mask at density 0.8, trained for one
round; the server then magnitude-prunes the averaged model to ``k_l(S)`` after round 1 (the
code's round 0), and the mask stays fixed from there. ``official_density: true`` replays that
(global scope, keeping ``N_m − ⌊(1 − S) N_m⌋`` weights, layer budgets left at ``k_l(S)``).

Communication: FedDST's (``randommask``). The warm start is a simulation shortcut (the server
computes on client ``c``'s data); a deployment would send ``θ_0`` as a seed and have client
``c`` upload its mask. ``warm_start_charge: mask`` (default) charges that upload, ``N_m``
bits, as round 0; ``none`` charges nothing, as the code. Either way every client, ``c``
included, pays the ``N_m`` mask bits at its first download (clients start all ones).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm.algorithms import feddst
from fedcomm.algorithms.core import FedAlgorithm, register
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.context import ClientData, Message, WarmStartContext
from fedcomm.algorithms.sparse import SparseConfig
from fedcomm.algorithms.sparse import codec as _codec
from fedcomm.algorithms.sparse import masks as _masks
from fedcomm.comm.payload import Mask, Payload
from fedcomm.models import dropout


class Config(SparseConfig):
    name: Literal["grasp"] = "grasp"
    client: Literal["first", "random"] = Field(
        "first", description="whose data GraSP scores on: client 0 (the code) or a random one"
    )
    scope: Literal["global", "layer"] = Field(
        "global", description="global (GraSP): 1 − S over all layers; layer: k_l(S) per layer"
    )
    temperature: float = Field(200.0, gt=0, description="logits are divided by it (Synflow)")
    official_density: bool = Field(
        False, description="the code's bug: mask at density S, server prunes to S after round 1"
    )
    warm_start_charge: Literal["none", "mask"] = Field(
        "mask", description="round-0 cost of the warm start: c's mask upload, or none (the code)"
    )


def grasp_scores(
    model: nn.Module,
    params: Mapping[str, Tensor],
    data: ClientData,
    batch_size: int,
    temperature: float = 200.0,
) -> dict[str, Tensor]:
    """``S(−θ) = −θ ⊙ Hg`` for every maskable weight ``θ`` of ``model`` (see the docstring)."""
    names = [la.name for la in _masks.maskable_layers(model)]
    leaves = {k: params[k].detach().requires_grad_(True) for k in names}
    rest = {k: v.detach() for k, v in params.items() if k not in leaves}
    batches = torch.arange(data.num_examples, device=data.x.device).split(batch_size)

    def grads(idx: Tensor, create_graph: bool) -> tuple[Tensor, ...]:
        with dropout.disabled(model):  # a measurement: the whole network, no draw
            logits = functional_call(model, {**rest, **leaves}, (data.x[idx],))
        loss = _local.cross_entropy(logits / temperature, data.y[idx])
        return torch.autograd.grad(
            loss, list(leaves.values()), create_graph=create_graph, materialize_grads=True
        )

    g = [torch.zeros_like(v) for v in leaves.values()]
    for idx in batches:
        for acc, gi in zip(g, grads(idx, False), strict=True):
            acc.add_(gi.detach())
    hg = [torch.zeros_like(v) for v in leaves.values()]
    for idx in batches:
        dot = torch.stack(
            [(gi * si).sum() for gi, si in zip(grads(idx, True), g, strict=True)]
        ).sum()
        hvp = torch.autograd.grad(dot, list(leaves.values()), materialize_grads=True)
        for acc, h in zip(hg, hvp, strict=True):
            acc.add_(h)
    return {k: -(leaves[k].detach() * h) for k, h in zip(leaves, hg, strict=True)}


def grasp_mask(scores: Mapping[str, Tensor], kept: int | Mapping[str, int]) -> _masks.Masks:
    """Keep the smallest ``S(−θ)``: ``kept`` over all layers (an int, global scope) or per
    layer (a mapping); ties go to the lower index."""
    if not isinstance(kept, int):
        return {k: _masks.top_k(-s, kept[k]) for k, s in scores.items()}
    flat = torch.cat([-s.reshape(-1) for s in scores.values()])  # (N_m,)
    chosen = _masks.top_k(flat, kept).split([s.numel() for s in scores.values()])
    return {k: c.reshape(s.shape) for (k, s), c in zip(scores.items(), chosen, strict=True)}


@register(Config)
def build(cfg: Config) -> FedAlgorithm[feddst.ServerState]:
    S = cfg.sparsity

    def warm_start(
        state: feddst.ServerState, train: Sequence[ClientData], ctx: WarmStartContext
    ) -> tuple[feddst.ServerState, Sequence[Message]]:
        cid = 0
        if cfg.client == "random":
            cid = int(
                torch.randint(
                    len(train), (1,), generator=ctx.generator, device=ctx.generator.device
                )
            )
        scores = grasp_scores(
            ctx.model, state.params, train[cid], ctx.local.batch_size, cfg.temperature
        )
        n_m = sum(s.numel() for s in scores.values())
        kept: int | Mapping[str, int]
        if cfg.official_density:
            kept = n_m - math.floor((1 - S) * n_m)
        elif cfg.scope == "global":
            kept = math.floor((1 - S) * n_m + 0.5)
        else:
            kept = state.budgets
        masks = grasp_mask(scores, kept)
        budgets = (
            state.budgets if cfg.official_density else {k: int(m.sum()) for k, m in masks.items()}
        )
        new = replace(
            state,
            params=_masks.apply_masks(state.params, masks),
            masks=masks,
            budgets=budgets,
            digest=_masks.digest(masks),
        )
        if cfg.warm_start_charge == "none":
            return new, []
        upload = Payload({_codec.MASK + k: Mask(m) for k, m in masks.items()})
        return new, [(cid, "up", upload)]

    return feddst.make(cfg, None, dense_start=True, warm_start=warm_start)
