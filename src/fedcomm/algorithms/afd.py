"""AFD: single-model Adaptive Federated Dropout.

Bouacida, Hou, Zang and Liu, "Adaptive Federated Dropout: Improving Communication Efficiency and
Generalization for Federated Learning", IEEE INFOCOM Workshops 2021 (arXiv:2011.04050); as the
baseline of Xue et al., FedBIAD (spec ``specs/fedsparse-fedbiad.md`` §2.5, Rec: single-model).

The server holds an activation score map (one score per unit of every layer of
``feddrop.unit_layers(model)``, initially 0), the current sub-model (unit keep masks, exactly
``n − round(p·n)`` of the ``n`` units kept in every hidden FC layer and conv layer; the output
layer stays full, §2.7) and the previous round's mean client loss ``ℓ_{t−1}``.

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
structure. The score rule is the spec's reading of the paper (§2.5 **[AMB]**).

Sequential Linear/Conv chains only (``mlp``, ``cnn``, ``mnist_cnn``), like FedDrop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from fedcomm.algorithms import _jobs, feddrop
from fedcomm.algorithms.base import (
    AlgorithmConfig,
    ClientContext,
    ClientData,
    ClientResult,
    FedAlgorithm,
    RoundContext,
    Uplink,
    client_weights,
    clone_params,
    register,
)
from fedcomm.comm.payload import Entry, Free, Mask, Meta, Payload
from fedcomm.models.groups import GroupSpec
from fedcomm.seeding import Stream, torch_generator
from fedcomm.server_opt import OptState, ServerOptConfig, apply_step
from fedcomm.types import Params

UNIT = "unit/"  # f"unit/{layer}": a hidden layer's (count,) unit keep mask in the downlink
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
class ServerState:
    params: Params
    opt_state: OptState
    layers: tuple[GroupSpec, ...]
    keep: dict[str, Tensor]  # (count,) bool per layer: the current sub-model
    scores: dict[str, Tensor]  # (count,) float per layer: the activation score map
    prev_loss: float | None  # ℓ_{t−1}, the last round's mean client loss (None before round 1)
    resampled: float = 0.0  # 1.0 if the last server update drew a new sub-model


# --- pure pieces ------------------------------------------------------------------------------


def keep_counts(layers: Sequence[GroupSpec], p: float) -> dict[str, int]:
    """Units kept per layer: ``count − round(p·count)`` (at least one), the output layer full."""
    dropped = feddrop.drop_counts(layers, conv_rate=p, fc_rate=p, drop_output=False)
    return {s.name: s.count - dropped[s.name] for s in layers}


def weighted_selection(scores: Tensor, n_keep: int, generator: torch.Generator) -> Tensor:
    """A ``(count,)`` bool mask with exactly ``n_keep`` ones: units drawn without replacement with
    probability proportional to their score among the positive-score units, then (when fewer
    than ``n_keep`` units have a positive score) the rest drawn uniformly from the others."""
    count = scores.numel()
    keep = torch.zeros(count, dtype=torch.bool, device=scores.device)
    positive = scores > 0
    n_weighted = min(n_keep, int(positive.sum()))
    if n_weighted > 0:
        weights = torch.where(positive, scores, 0.0).double()
        keep[torch.multinomial(weights, n_weighted, replacement=False, generator=generator)] = True
    rest = (~keep).nonzero().squeeze(1)
    top_up = rest[
        torch.randperm(rest.numel(), generator=generator, device=generator.device)[
            : n_keep - n_weighted
        ]
    ]
    keep[top_up] = True
    return keep


def sample_keep(
    layers: Sequence[GroupSpec],
    scores: Mapping[str, Tensor],
    counts: Mapping[str, int],
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """A sub-model: :func:`weighted_selection` per layer, in layer order (all-zero scores give a
    uniformly random sub-model)."""
    return {s.name: weighted_selection(scores[s.name], counts[s.name], generator) for s in layers}


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


def pattern_entries(
    layers: Sequence[GroupSpec], keep: Mapping[str, Tensor], counted: bool
) -> dict[str, Entry]:
    """The hidden layers' unit keep masks: ``Mask`` (1 bit per unit) if ``counted``, else
    ``Free``. The output layer is never dropped and needs no pattern."""
    entry = Mask if counted else Free
    return {UNIT + s.name: entry(keep[s.name]) for s in layers if not s.is_output}


def submodel_fraction(keep: Mapping[str, Tensor]) -> float:
    """Fraction of the model's entries in the sub-model."""
    return sum(int(m.sum()) for m in keep.values()) / sum(m.numel() for m in keep.values())


def _server_metrics(state: ServerState) -> dict[str, float]:
    out = {"afd/resampled": state.resampled}
    return out if state.prev_loss is None else out | {"afd/round_loss": state.prev_loss}


@register(Config)
def build(cfg: Config) -> FedAlgorithm:
    opt = cfg.server.build()

    def init_server(params: Params, ctx: RoundContext) -> ServerState:
        layers = feddrop.unit_layers(ctx.model)
        scores = {s.name: torch.zeros(s.count, device="cpu") for s in layers}  # with the draws
        g = torch_generator(ctx.seed, Stream.ALGORITHM, 0)
        keep = sample_keep(layers, scores, keep_counts(layers, cfg.p), g)  # uniform
        return ServerState(clone_params(params), opt.init(params), layers, keep, scores, None)

    def broadcast(state: ServerState, client_id: int, cstate: None, ctx: RoundContext) -> Payload:
        masks = feddrop.param_masks(state.layers, state.keep, state.params)
        pattern = pattern_entries(state.layers, state.keep, cfg.count_pattern)
        return Payload(feddrop.encode_kept(state.params, masks) | pattern)

    def client_job(
        down: Mapping[str, Tensor], cstate: None, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        def finish(res: _jobs.JobResult, sub: Params, keep: dict[str, Tensor]) -> ClientResult:
            delta = feddrop.encode_kept({k: res.live[k] - sub[k] for k in sub}, keep)
            loss = Meta(torch.tensor(res.loss, dtype=torch.float32, device="cpu"))  # 32 bits
            return ClientResult(
                uplink=Payload(delta | {LOSS: loss}),
                state=None,
                local_params=res.live,
                num_examples=data.num_examples,
                metrics={"train/loss": res.loss, "afd/submodel_fraction": submodel_fraction(keep)},
            )

        return feddrop.submodel_job(down, data, ctx, finish)

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        deltas = [feddrop.decode_kept(u.tensors) for u in uplinks]
        masks = [feddrop.keep_masks(u.tensors) for u in uplinks]
        weights = client_weights(uplinks, cfg.weighting)
        delta, held = feddrop.aggregate(deltas, masks, weights, "held")
        step, opt_state = opt.update(delta, state.opt_state)
        step = {k: torch.where(held[k], s, 0.0) for k, s in step.items()}
        losses = [float(u.tensors[LOSS]) for u in uplinks]
        loss = sum(w * lo for w, lo in zip(weights, losses, strict=True)) / sum(weights)
        g = torch_generator(ctx.seed, Stream.ALGORITHM, ctx.round_)
        counts = keep_counts(state.layers, cfg.p)
        keep, scores, resampled = next_submodel(
            state.layers, state.keep, state.scores, state.prev_loss, loss, counts, g
        )
        params = apply_step(state.params, step)
        return ServerState(params, opt_state, state.layers, keep, scores, loss, float(resampled))

    return FedAlgorithm(
        name=cfg.name,
        config=cfg,
        init_server=init_server,
        init_client=lambda client_id: None,
        broadcast=broadcast,
        client_update=_jobs.job_client_update(client_job),
        client_job=client_job,
        server_update=server_update,
        global_params=lambda s: s.params,
        server_metrics=_server_metrics,
        uploaded_model=feddrop.uploaded_model,
        validate_model=feddrop.validate_model,
    )
