"""FedDST: federated dynamic sparse training with per-layer magnitude prune / gradient regrow.

Bibikar et al., "Federated Dynamic Sparse Training: Computing Less, Communicating Less, Yet
Learning Better", AAAI 2022 (arXiv:2112.09824). The paper body was not available; behaviour
follows the official code (bibikar/feddst @ 25d6184) as read in ``specs/feddst-progfed.md`` §1.
Masks, layer budgets ``k_l(S)`` and messages: :mod:`fedcomm.algorithms._masks`.

* init: ``m_0`` = layer-wise magnitude pruning of ``θ_0`` to ``k_l(S)`` (``distribution``);
* client: local SGD (``train.local``: lr, momentum, weight decay; a fresh optimizer each round)
  from the global ``θ ⊙ m``, masked-out weights zeroed after every step. In a readjustment
  round, after local epoch ``readjust_at_epoch`` (default: the last): the dense gradient ``g``
  of plain CE on that epoch's last minibatch; per layer keep the ``k_l(S')`` largest ``|θ|``
  among active entries, ``S' = S + (1 − S)·α_r``; grow ``n = k_l(S) − #active`` entries with the
  largest ``|g|`` among ``grow_candidates`` and set them to ``θ = 0``;
* server: ``θ_j = Σ_k w_k m_kj θ_kj / Σ_k w_k m_kj`` (0 if nobody kept ``j``), biases averaged,
  ``m`` = union of the client masks magnitude-pruned back to ``k_l(S)``, ``θ ← θ ⊙ m``. (The
  code prunes only "if the global sparsity is below S"; with its budgets, which count biases,
  that is always the case after a prune, so the prune always runs, as here.)

Schedule (1-based rounds ``r``): readjust iff ``(r − 1) mod readjust_every = 0``, ``r <
readjust_end`` and ``α_r > 0`` (the code's rounds are 0-based, so its first readjustment, at
its ``r = 1``, is its second round; here it is round 1). ``alpha_schedule``: ``gate_only`` (the
code, default: ``α_r = α`` before ``readjust_end``, the cosine only gates) or ``cosine`` (RigL's
intent: ``α_r = α/2·(1 + cos(π r / readjust_end))``). ``readjust_end`` null means ``R // 2``
with ``R = train.rounds`` (the code's default; :meth:`Config.with_rounds`, called by
``Params.algorithm``, so the run config records the resolved value), or
:data:`DEFAULT_READJUST_END` (200, the code's ``R // 2`` at its default ``R = 400``) when the
algorithm is built without a run.

Communication (spec §1(c); ``N_m`` maskable weights, ``B`` bias/other entries, 32-bit values):

* down: ``32·d·N_m + 32·B`` (active global values + biases), plus ``N_m`` mask bits iff the
  client's mask (a digest in its state; all ones before its first participation) differs from
  the global mask. Round 1's values are ``Free`` (``free_initial_download``: ``θ_0`` is a seed);
* up: ``32·d_k·N_m + 32·B``, plus the mask in rounds the client readjusted: ``N_m`` bits
  (``upload_mask: sent``) or ``d_k·N_m`` bits (``kept``, the code's count).

Flags for the spec's surprises (§1(e)), defaults faithful to the code: ``alpha_schedule``
(gate_only), ``grow_candidates`` (``all``: active entries may be re-grown and reset to 0, so a
layer may end below ``k_l(S)``; ``inactive``: exactly ``k_l(S)``), ``readjust_at_epoch`` (null =
last; an index past the local epochs means the last; the code's cumulative epoch counter is not
kept), ``weighting`` (``num_examples``; the code weights by 2 × #minibatches, ∝ examples up to
rounding). Not reproduced: sampling with replacement, fixed minibatches, double softmax,
``--min-votes``, ``--remember-old`` (bugged), FedProx. RandomMask (``randommask``) and GraSP
(``grasp``) reuse :func:`make` with a fixed mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm.algorithms import _jobs, _local, _masks
from fedcomm.algorithms._masks import Masks
from fedcomm.algorithms._reuse import Reused
from fedcomm.algorithms.base import (
    AlgorithmConfig,
    ClientContext,
    ClientData,
    ClientResult,
    FedAlgorithm,
    Message,
    RoundContext,
    Uplink,
    WarmStartContext,
    client_weights,
    register,
)
from fedcomm.comm.payload import Payload
from fedcomm.server_opt import ServerOptConfig
from fedcomm.types import Params

DEFAULT_READJUST_END = 200  # the code's R // 2 at its default R = 400 rounds


class SparseConfig(AlgorithmConfig):
    """Fields shared by the fixed- and dynamic-mask algorithms."""

    sparsity: float = Field(0.8, ge=0, lt=1, description="S: target sparsity of maskable weights")
    distribution: _masks.Distribution = Field(
        "official", description="layer budgets: the FedDST code's rule, RigL's ERK or uniform"
    )
    weighting: Literal["num_examples", "uniform"] = "num_examples"
    free_initial_download: bool = Field(
        True, description="round 1's values cost nothing (θ_0 is a seed); mask bits still paid"
    )

    @model_validator(mode="after")
    def _no_server_optimizer(self) -> SparseConfig:
        if self.server != ServerOptConfig():
            raise ValueError(
                f"{self.name} averages the kept weights directly and has no server optimizer; "
                "remove `server`"
            )
        return self


class Config(SparseConfig):
    name: Literal["feddst"] = "feddst"
    alpha: float = Field(0.01, ge=0, le=1, description="α: readjustment ratio (README: 0.01)")
    readjust_every: int = Field(10, ge=1, description="ΔR: rounds between readjustments")
    readjust_end: int | None = Field(
        None, ge=1, description="R_end: no readjustment from this round on; null = 200"
    )
    alpha_schedule: Literal["gate_only", "cosine"] = Field(
        "gate_only", description="gate_only: prune with α (the code); cosine: α_r (RigL)"
    )
    grow_candidates: Literal["all", "inactive"] = Field(
        "all", description="entries regrowth may pick: all (the code) or only inactive ones"
    )
    readjust_at_epoch: int | None = Field(
        None, ge=0, description="0-based local epoch after which to readjust; null = the last"
    )
    upload_mask: Literal["sent", "kept"] = Field(
        "sent", description="readjusted mask upload: N_m bits, or d_k·N_m bits (the code)"
    )

    def with_rounds(self, rounds: int) -> Config:
        """This config with ``readjust_end = rounds // 2`` (the code's default) if it is null."""
        if self.readjust_end is not None:
            return self
        return self.model_copy(update={"readjust_end": max(1, rounds // 2)})


@dataclass(frozen=True)
class Readjustment:
    """When and how clients readjust their masks (absent: the mask is fixed)."""

    alpha: float
    every: int = 10
    end: int = DEFAULT_READJUST_END
    schedule: str = "gate_only"
    candidates: str = "all"
    at_epoch: int | None = None
    upload_mask: _masks.MaskCharge = "sent"

    def alpha_at(self, round_: int) -> float:
        """``α_r``: the pruning ratio of round ``round_`` (0 from ``end`` on)."""
        if round_ >= self.end or self.alpha <= 0:
            return 0.0
        if self.schedule == "cosine":
            return self.alpha / 2 * (1 + math.cos(math.pi * round_ / self.end))
        return self.alpha

    def due(self, round_: int) -> bool:
        return (round_ - 1) % self.every == 0 and self.alpha_at(round_) > 0


@dataclass(frozen=True)
class ClientState:
    mask_digest: str | None = None  # of the client's current mask; None = all ones (never seen)


@dataclass(frozen=True)
class ServerState:
    params: Params  # θ ⊙ m
    masks: Masks
    budgets: Mapping[str, int]  # k_l(S) the server prunes the union back to
    digest: str  # of ``masks``
    ones_digest: str  # of the all-ones mask clients start with
    churn: float = 0.0  # fraction of maskable entries whose global bit changed this round
    readjusted: bool = False


# --- pure pieces ---------------------------------------------------------------------------------


def layers_of(model: nn.Module | None) -> tuple[_masks.MaskLayer, ...]:
    if model is None:
        raise ValueError("sparse training needs the model structure in the round context")
    layers = _masks.maskable_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no Conv/Linear weights to mask")
    return layers


def validate_model(model: nn.Module) -> None:
    layers_of(model)


def ce_grads(
    model: nn.Module, params: Mapping[str, Tensor], names: Sequence[str], x: Tensor, y: Tensor
) -> dict[str, Tensor]:
    """Dense gradient of plain mean CE w.r.t. the ``names`` tensors (masked entries included)."""
    leaves = {k: params[k].detach().requires_grad_(True) for k in names}
    logits = functional_call(model, {**params, **leaves}, (x,))
    grads = torch.autograd.grad(_local.cross_entropy(logits, y), list(leaves.values()))
    return dict(zip(leaves, grads, strict=True))


def readjust(
    params: Mapping[str, Tensor],
    masks: Mapping[str, Tensor],
    grads: Mapping[str, Tensor],
    keep: Mapping[str, int],
    target: Mapping[str, int],
    candidates: str,
) -> tuple[Params, Masks]:
    """Per layer: keep the ``keep[l]`` largest ``|θ|`` among active entries, then grow
    ``target[l] − #kept`` entries by ``|g|`` among ``candidates`` (``all`` entries or the
    ``inactive`` ones) and set them to 0. Returns new ``(θ ⊙ m, m)``."""
    new_params, new_masks = dict(params), {}
    for name, m in masks.items():
        kept = _masks.top_k(params[name].abs(), keep[name], m)
        n_grow = max(0, target[name] - int(kept.sum()))
        pool = None if candidates == "all" else ~kept
        grown = _masks.top_k(grads[name].abs(), n_grow, pool)
        new_masks[name] = kept | grown
        new_params[name] = torch.where(kept & ~grown, params[name], 0.0)
    return new_params, new_masks


@dataclass
class _Sent:
    """The downlinks already encoded for one server state (they are the same for every client
    with the same mask knowledge)."""

    state: ServerState | None = None
    payloads: dict[tuple[str, bool], Payload] = field(default_factory=dict)


MASK = "mask."  # a client's current masks in its job's frozen tensors


def _masked_post(
    live: dict[str, Tensor], frozen: Mapping[str, Tensor], before: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """``θ ← θ ⊙ m`` after every step (the masks are per client, read from ``frozen``)."""
    return {
        k: torch.where(frozen[MASK + k], v, 0.0) if MASK + k in frozen else v
        for k, v in live.items()
    }


def readjust_batch(num_batches: int, per_epoch: int, at_epoch: int | None) -> int:
    """Index of the batch after which to readjust: the end of local epoch ``at_epoch`` (0-based;
    None or past the end: the last batch)."""
    last = num_batches - 1
    return last if at_epoch is None else min(last, (at_epoch + 1) * per_epoch - 1)


# --- the algorithm -------------------------------------------------------------------------------

WarmStart = Callable[
    [ServerState, Sequence[ClientData], WarmStartContext], tuple[ServerState, Sequence[Message]]
]


def make(
    cfg: SparseConfig,
    adjust: Readjustment | None,
    *,
    dense_start: bool = False,
    warm_start: WarmStart | None = None,
) -> FedAlgorithm:
    """FedDST's functions; ``adjust=None`` keeps the mask fixed (RandomMask). ``dense_start``
    leaves ``m_0`` all ones for ``warm_start`` to set (GraSP)."""
    S = cfg.sparsity

    def init_server(params: Params, ctx: RoundContext) -> ServerState:
        layers = layers_of(ctx.model)
        budgets = _masks.layer_budgets(layers, S, cfg.distribution)
        dense = _masks.ones(layers, next(iter(params.values())).device)
        masks = dense if dense_start else _masks.prune_to_budgets(params, dense, budgets)
        return ServerState(
            _masks.apply_masks(params, masks),
            masks,
            budgets,
            _masks.digest(masks),
            _masks.digest(dense),
        )

    def broadcast(
        state: ServerState, client_id: int, cstate: ClientState, ctx: RoundContext
    ) -> Payload:
        known = (cstate.mask_digest or state.ones_digest) == state.digest
        free = cfg.free_initial_download and ctx.round_ == 1
        charge: _masks.MaskCharge = "known" if known else "sent"
        if sent.state is not state:  # one encoding per server state and kind, not per client
            sent.state, sent.payloads = state, {}
        if (charge, free) not in sent.payloads:
            payload = _masks.encode(state.params, state.masks, charge, free_values=free)
            sent.payloads[(charge, free)] = payload
        return sent.payloads[(charge, free)]

    sent = _Sent()

    program = _jobs.LocalProgram(post_step=_masked_post)

    decoded: Reused[tuple[Params, _masks.Masks]] = Reused()  # the round's downlink, decoded once
    digests: Reused[str] = Reused()  # the last mask set hashed (every unchanged client's)

    def client_job(
        down: Mapping[str, Tensor], cstate: ClientState, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        params, masks = decoded.get(list(down.values()), lambda: _masks.decode(down))
        start = masks
        due = adjust is not None and adjust.due(ctx.round_) and data.num_examples > 0
        batches = _local.batch_schedule(data.num_examples, ctx.local, ctx.generator)
        per_epoch = math.ceil(data.num_examples / ctx.local.batch_size) if batches else 1
        at = readjust_batch(len(batches), per_epoch, adjust.at_epoch) if due and adjust else -1

        def readjust_now(
            i: int,
            loss: float,
            live: Mapping[str, Tensor],
            frozen: Mapping[str, Tensor],
            idx: Tensor,
        ) -> tuple[Params, Params]:
            assert adjust is not None
            current = {k: frozen[MASK + k] for k in masks}
            layers = layers_of(ctx.model)
            s_prune = S + (1 - S) * adjust.alpha_at(ctx.round_)
            grads = ce_grads(ctx.model, live, list(current), data.x[idx], data.y[idx])
            new_params, new_masks = readjust(
                live,
                current,
                grads,
                _masks.layer_budgets(layers, s_prune, cfg.distribution),
                _masks.layer_budgets(layers, S, cfg.distribution),
                adjust.candidates,
            )
            return {k: new_params[k] for k in new_masks}, {
                MASK + k: m for k, m in new_masks.items()
            }

        def finish(res: _jobs.JobResult) -> ClientResult:
            final = {k: v.detach() for k, v in res.live.items()}
            now = {k: res.frozen[MASK + k] for k in masks}
            readjusted = at >= 0 and adjust is not None
            charge: _masks.MaskCharge = adjust.upload_mask if readjusted and adjust else "known"
            metrics = {"train/loss": res.loss}
            if readjusted:
                metrics[f"{cfg.name}/client_churn"] = _masks.changed(start, now) / max(
                    1, _masks.count(now)[1]
                )
            return ClientResult(
                uplink=_masks.encode(final, now, charge),
                state=ClientState(digests.get(list(now.values()), lambda: _masks.digest(now))),
                local_params=final,
                num_examples=data.num_examples,
                metrics=metrics,
            )

        return _jobs.new_job(
            program,
            params,
            data,
            ctx.local,
            batches,
            finish,
            frozen={MASK + k: m for k, m in masks.items()},
            after_step=readjust_now if at >= 0 else None,
            hook_steps=frozenset({at}) if at >= 0 else frozenset(),
        )

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        decoded = [_masks.decode(u.tensors) for u in uplinks]
        weights = client_weights(uplinks, cfg.weighting)
        avg, union = _masks.masked_average(
            [p for p, _ in decoded], [m for _, m in decoded], weights
        )
        masks = _masks.prune_to_budgets(avg, union, state.budgets)
        total = _masks.count(masks)[1]
        return replace(
            state,
            params=_masks.apply_masks(avg, masks),
            masks=masks,
            digest=_masks.digest(masks),
            churn=_masks.changed(state.masks, masks) / max(1, total),
            readjusted=adjust is not None and adjust.due(ctx.round_),
        )

    def server_metrics(state: ServerState) -> dict[str, float]:
        return {
            "mask_churn": state.churn,
            "density": _masks.density(state.masks),
            "readjusted": float(state.readjusted),
        }

    return FedAlgorithm(
        name=cfg.name,
        config=cfg,
        init_server=init_server,
        init_client=lambda client_id: ClientState(),
        broadcast=broadcast,
        client_update=_jobs.job_client_update(client_job),
        client_job=client_job,
        server_update=server_update,
        global_params=lambda s: s.params,
        server_metrics=server_metrics,
        uploaded_model=lambda down, up: _masks.decode(up)[0],
        validate_model=validate_model,
        warm_start=warm_start,
    )


@register(Config)
def build(cfg: Config) -> FedAlgorithm:
    adjust = Readjustment(
        alpha=cfg.alpha,
        every=cfg.readjust_every,
        end=cfg.readjust_end if cfg.readjust_end is not None else DEFAULT_READJUST_END,
        schedule=cfg.alpha_schedule,
        candidates=cfg.grow_candidates,
        at_epoch=cfg.readjust_at_epoch,
        upload_mask=cfg.upload_mask,
    )
    return make(cfg, adjust)
