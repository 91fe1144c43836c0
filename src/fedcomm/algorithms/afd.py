"""AFD: single-model Adaptive Federated Dropout.

Bouacida, Hou, Zang and Liu, "Adaptive Federated Dropout: Improving Communication Efficiency and
Generalization for Federated Learning", IEEE INFOCOM Workshops 2021 (arXiv:2011.04050); as the
baseline of Xue et al., FedBIAD (Section V-A, which does not say which AFD: single-model here).

The server holds an activation score map (one score per unit of every layer of
``feddrop.unit_layers(model)``, initially 0), the current sub-model (unit keep masks, exactly
``n − round(p·n)`` of the ``n`` units kept in every hidden FC layer and conv layer; the output
layer stays full: its units are the classes) and the previous round's mean client loss ``ℓ_{t−1}``.

* round 1: a uniformly random sub-model (from ``(seed, ALGORITHM, 0)``);
* round ``t``: every sampled client gets the same sub-model, its values at 32 bits each (down),
  trains it masked (dropped units are zero and frozen: the smaller dense network, no rescaling,
  as in :mod:`.feddrop`) and uploads the delta of the same entries (32 bits each) plus its mean
  training loss as a ``Meta`` scalar (32 bits, counted: uplinks carry tensors only, so this is
  how the server learns ``ℓ_t``);
* the server averages the deltas per held entry (:func:`feddrop.aggregate`, ``held``; all
  clients hold the same entries, so this is the plain weighted mean) and applies
  ``w ← w + server_opt(Δ)`` (SGD, lr 1) on the sub-model; ``ℓ_t`` is the mean of the uploaded
  losses with the aggregation weights (:func:`next_submodel`):

  - ``ℓ_t < ℓ_{t−1}``: every kept unit's score is set to ``(ℓ_{t−1} − ℓ_t) / ℓ_{t−1}`` and the
    sub-model is reused;
  - otherwise: a new sub-model is drawn per layer by score-proportional sampling without
    replacement among the units with a positive score, topped up uniformly from the rest until
    exactly the layer's keep count is reached (generator ``(seed, ALGORITHM, t)``);
  - after round 1 there is no ``ℓ_0``: the sub-model is reused and the scores stay 0.

Accounting of the pattern: the sub-model is the server's choice, so a real deployment would send
it (a unit mask, 1 bit per hidden unit); by default it is counted as 0 bits (``Free``), as the
FedBIAD paper compares sub-model sizes only. ``count_pattern=True`` sends the hidden layers' unit
masks as ``Mask`` (1 bit per unit, downlink only: the server knows what it sent). The full-shape
parameter masks are always ``Free``: the client derives them from the unit masks and the model
structure. The score rule is our reading of the AFD paper and of a third-party re-implementation
(cyyever/distributed_learning_simulator), not checked against official code.

Sequential Linear/Conv chains only (``mlp``, ``cnn``, ``mnist_cnn``), like FedDrop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from fedcomm.algorithms import submodel
from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm, RoundContext, Uplink, register
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.submodel.merge import masked_mean
from fedcomm.algorithms.submodel.units import keep_counts, keep_ranked, select
from fedcomm.comm.payload import Entry, Free, Mask, Meta
from fedcomm.models.groups import GroupSpec
from fedcomm.seeding import Stream, torch_generator
from fedcomm.server_opt import ServerOptConfig

LOSS = "afd/loss"  # the client's mean training loss in the uplink (Meta, 32 bits)


class Config(AlgorithmConfig):
    name: Literal["afd"] = "afd"
    server: ServerOptConfig = Field(default_factory=ServerOptConfig)  # sgd, lr 1: averaging
    p: float = Field(
        0.2, ge=0, lt=1, description="fraction of hidden FC units / conv filters dropped"
    )
    count_pattern: bool = Field(
        False, description="send the sub-model's unit masks as Mask (1 bit per hidden unit)"
    )
    weighting: Literal["num_examples", "uniform"] = "num_examples"


@dataclass(frozen=True)
class ServerState(submodel.ServerState):
    keep: dict[str, Tensor]  # (count,) bool per layer: the current sub-model
    scores: dict[str, Tensor]  # (count,) float per layer: the activation score map
    prev_loss: float | None  # ℓ_{t−1}, the last round's mean client loss (None before round 1)
    resampled: float = 0.0  # 1.0 if the last server update drew a new sub-model


# --- the selection rule: score-weighted sampling, moved by the round's loss -------------------


def weighted_rank(scores: Tensor, n_keep: int, generator: torch.Generator) -> Tensor:
    """``n_keep`` units, best first: drawn without replacement with probability proportional to
    their score among the positive-score units, then (when fewer than ``n_keep`` units have a
    positive score) the rest drawn uniformly from the others."""
    positive = scores > 0
    n_weighted = min(n_keep, int(positive.sum()))
    drawn = torch.zeros(0, dtype=torch.long, device=scores.device)
    if n_weighted > 0:
        weights = torch.where(positive, scores, 0.0).double()
        drawn = torch.multinomial(weights, n_weighted, replacement=False, generator=generator)
    left = torch.ones(scores.numel(), dtype=torch.bool, device=scores.device)
    left[drawn] = False
    rest = left.nonzero().squeeze(1)
    perm = torch.randperm(rest.numel(), generator=generator, device=generator.device)
    return torch.cat([drawn, rest[perm[: n_keep - n_weighted]]])


def weighted_selection(scores: Tensor, n_keep: int, generator: torch.Generator) -> Tensor:
    """A ``(count,)`` bool mask with exactly ``n_keep`` ones: the units of :func:`weighted_rank`."""
    return keep_ranked(weighted_rank(scores, n_keep, generator), n_keep, scores.numel())


def sample_keep(
    layers: Sequence[GroupSpec],
    scores: Mapping[str, Tensor],
    counts: Mapping[str, int],
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """A sub-model: :func:`weighted_rank` per layer, in layer order (all-zero scores give a
    uniformly random sub-model)."""
    return select(layers, counts, lambda s, n: weighted_rank(scores[s.name], n, generator))


def next_submodel(
    layers: Sequence[GroupSpec],
    keep: Mapping[str, Tensor],
    scores: Mapping[str, Tensor],
    prev_loss: float | None,
    loss: float,
    counts: Mapping[str, int],
    generator: torch.Generator,
) -> tuple[dict[str, Tensor], dict[str, Tensor], bool]:
    """``(keep, scores, resampled)`` for the next round from this round's mean loss ``ℓ_t``.

    ``ℓ_t < ℓ_{t−1}``: kept units score ``(ℓ_{t−1} − ℓ_t) / ℓ_{t−1}``, the sub-model is reused;
    no ``ℓ_{t−1}`` yet: nothing changes; otherwise a new sub-model by :func:`sample_keep`."""
    if prev_loss is None:
        return dict(keep), dict(scores), False
    if loss < prev_loss:  # False for a NaN loss: resample
        reward = (prev_loss - loss) / prev_loss if prev_loss > 0 else 0.0
        new = {k: torch.where(keep[k], reward, s) for k, s in scores.items()}
        return dict(keep), new, False
    return sample_keep(layers, scores, counts, generator), dict(scores), True


def round_loss(uplinks: Sequence[Uplink], weights: Sequence[float]) -> float:
    """``ℓ_t``: the uploaded mean training losses, averaged with the aggregation weights."""
    losses = [float(u.tensors[LOSS]) for u in uplinks]
    return sum(w * lo for w, lo in zip(weights, losses, strict=True)) / sum(weights)


def loss_entry(res: _jobs.JobResult) -> dict[str, Entry]:
    """The client's mean training loss for the uplink (32 bits)."""
    return {LOSS: Meta(torch.tensor(res.loss, dtype=torch.float32, device="cpu"))}


def _server_metrics(state: ServerState) -> dict[str, float]:
    out = {"afd/resampled": state.resampled}
    return out if state.prev_loss is None else out | {"afd/round_loss": state.prev_loss}


@register(Config)
def build(cfg: Config) -> FedAlgorithm[ServerState]:
    def init(base: submodel.ServerState, ctx: RoundContext) -> ServerState:
        """Round 1: a uniformly random sub-model (from ``(seed, ALGORITHM, 0)``), scores 0."""
        scores = {s.name: torch.zeros(s.count, device="cpu") for s in base.layers}  # with the draws
        g = torch_generator(ctx.seed, Stream.ALGORITHM, 0)
        keep = sample_keep(base.layers, scores, keep_counts(base.layers, cfg.p), g)
        return ServerState(base.params, base.opt_state, base.layers, keep, scores, None)

    def update(
        state: ServerState, uplinks: Sequence[Uplink], weights: list[float], ctx: RoundContext
    ) -> ServerState:
        """The score map and sub-model of round ``t + 1`` (generator ``(seed, ALGORITHM, t)``)."""
        loss = round_loss(uplinks, weights)
        g = torch_generator(ctx.seed, Stream.ALGORITHM, ctx.round_)
        counts = keep_counts(state.layers, cfg.p)
        keep, scores, resampled = next_submodel(
            state.layers, state.keep, state.scores, state.prev_loss, loss, counts, g
        )
        return replace(state, keep=keep, scores=scores, prev_loss=loss, resampled=float(resampled))

    return submodel.algorithm(
        cfg,
        submodel.Selection(lambda state, client_id, ctx: state.keep, init, update),
        masked_mean("held"),  # every client holds the same entries: the plain weighted mean
        weighting=cfg.weighting,
        pattern=Mask if cfg.count_pattern else Free,
        client_job=submodel.masked_client(cfg.name, meta=loss_entry),
        server_metrics=_server_metrics,
    )
