"""FedDST: federated dynamic sparse training with per-layer magnitude prune / gradient regrow.

Bibikar et al., "Federated Dynamic Sparse Training: Computing Less, Communicating Less, Yet
Learning Better", AAAI 2022 (arXiv:2112.09824). Behaviour follows the official code
(bibikar/feddst @ 25d6184), which fixes what the paper leaves open. Equation numbers are the
paper's (section "Methodology"): (2) the cosine ``α_r``, (3) the sparse weighted average.
Masks, layer budgets ``k_l(S)``, messages: :mod:`fedcomm.algorithms.sparse`; the readjustment
(Eq. 2, prune, regrow, its schedule): :mod:`fedcomm.algorithms.feddst.readjust`; the client's
masked job and upload: :mod:`fedcomm.algorithms.feddst.client`.

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

Communication (the official code's accounting, ``dst.py``): the active values and biases each
way, the mask only when the receiver lacks it (down: the client's mask differs from the global
one; up: rounds it readjusted); the rule in full: :mod:`fedcomm.algorithms.feddst.comm`.

Flags for the code's surprises, defaults faithful to the code: ``alpha_schedule``
(gate_only), ``grow_candidates`` (``all``: active entries may be re-grown and reset to 0, so a
layer may end below ``k_l(S)``; ``inactive``: exactly ``k_l(S)``), ``readjust_at_epoch`` (null =
last; an index past the local epochs means the last; the code's cumulative epoch counter is not
kept), ``weighting`` (``num_examples``; the code weights by 2 × #minibatches, ∝ examples up to
rounding). Not reproduced: sampling with replacement, fixed minibatches, double softmax,
``--min-votes``, ``--remember-old`` (bugged), FedProx. RandomMask (``randommask``) and GraSP
(``grasp``) reuse :func:`make` with a fixed mask.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

from pydantic import Field
from torch import Tensor, nn

from fedcomm.algorithms import core
from fedcomm.algorithms.core import FedAlgorithm
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core.context import (
    ClientContext,
    ClientData,
    Message,
    RoundContext,
    Uplink,
    WarmStartContext,
)
from fedcomm.algorithms.feddst import client
from fedcomm.algorithms.feddst.client import ClientShared, ClientState, frozen_masks
from fedcomm.algorithms.feddst.comm import Downlinks, mask_charge
from fedcomm.algorithms.feddst.readjust import (
    DEFAULT_READJUST_END,
    Readjustment,
    readjust_step,
)
from fedcomm.algorithms.sparse import SparseConfig, churn, layers_of, validate_model
from fedcomm.algorithms.sparse import budgets as _budgets
from fedcomm.algorithms.sparse import codec as _codec
from fedcomm.algorithms.sparse import masks as _masks
from fedcomm.algorithms.sparse.masks import Masks
from fedcomm.comm.payload import Payload
from fedcomm.types import ParamDict


class Config(SparseConfig):  # S, the layer budgets, the weighting: SparseConfig
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
class ServerState:
    params: ParamDict  # θ ⊙ m
    masks: Masks
    budgets: Mapping[str, int]  # k_l(S) the server prunes the union back to
    digest: str  # of ``masks``
    ones_digest: str  # of the all-ones mask clients start with
    churn: float = 0.0  # fraction of maskable entries whose global bit changed this round
    readjusted: bool = False


# --- mask initialisation -------------------------------------------------------------------------


def init_state(
    cfg: SparseConfig, params: ParamDict, model: nn.Module | None, dense: bool
) -> ServerState:
    """``m_0``: layer-wise magnitude pruning of ``θ_0`` to ``k_l(S)`` (all ones if ``dense``)."""
    layers = layers_of(model)
    budgets = _budgets.layer_budgets(layers, cfg.sparsity, cfg.distribution)
    ones = _masks.ones(layers, next(iter(params.values())).device)
    masks = ones if dense else _masks.prune_to_budgets(params, ones, budgets)
    return ServerState(
        _masks.apply_masks(params, masks), masks, budgets, _masks.digest(masks), _masks.digest(ones)
    )


# --- the client ----------------------------------------------------------------------------------


def client_job(
    cfg: SparseConfig,
    adjust: Readjustment | None,
    shared: ClientShared,
    down: Mapping[str, Tensor],
    cstate: ClientState,
    data: ClientData,
    ctx: ClientContext,
) -> _jobs.LocalJob:
    """Local SGD on ``θ ⊙ m`` from the global model; in a readjustment round, readjust after
    local epoch ``at_epoch`` (:func:`readjust_step`); upload ``(θ_k ⊙ m_k, m_k)``."""
    params, masks = shared.downlink(down)
    due = adjust is not None and adjust.due(ctx.round_)
    batches, at = client.plan(data, ctx, due, adjust.at_epoch if adjust else None)
    now = adjust if at >= 0 else None  # readjusting in this job
    upload_mask = now.upload_mask if now else None
    finish = partial(client.finish, cfg.name, upload_mask, shared, masks, data)
    return _jobs.new_job(
        shared.program,
        params,
        data,
        ctx.local,
        batches,
        finish,
        frozen=frozen_masks(masks),
        after_step=partial(readjust_step, cfg, now, data, ctx, list(masks)) if now else None,
        hook_steps=frozenset({at}) if now else frozenset(),
    )


# --- the server ----------------------------------------------------------------------------------


def aggregate(
    state: ServerState, uplinks: Sequence[Uplink], weighting: str, readjusted: bool
) -> ServerState:
    """Sparse weighted average of the clients' ``θ_k ⊙ m_k`` over the union of their masks
    (Eq. 3), magnitude-pruned back to ``k_l(S)``; ``θ ← θ ⊙ m``."""
    decoded = [_codec.decode(u.tensors) for u in uplinks]
    weights = core.client_weights(uplinks, weighting)
    values, votes = [p for p, _ in decoded], [m for _, m in decoded]
    avg, union = _masks.masked_average(values, votes, weights)  # Eq. 3
    masks = _masks.prune_to_budgets(avg, union, state.budgets)  # the union back to k_l(S)
    return replace(
        state,
        params=_masks.apply_masks(avg, masks),
        masks=masks,
        digest=_masks.digest(masks),
        churn=churn(state.masks, masks),
        readjusted=readjusted,
    )


def server_metrics(state: ServerState) -> dict[str, float]:
    return {
        "mask_churn": state.churn,
        "density": _masks.density(state.masks),
        "readjusted": float(state.readjusted),
    }


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
) -> FedAlgorithm[ServerState]:
    """FedDST's functions; ``adjust=None`` keeps the mask fixed (RandomMask). ``dense_start``
    leaves ``m_0`` all ones for ``warm_start`` to set (GraSP)."""
    sent, shared = Downlinks(), ClientShared()

    def init_server(params: ParamDict, ctx: RoundContext) -> ServerState:
        return init_state(cfg, params, ctx.model, dense_start)

    def broadcast(
        state: ServerState, client_id: int, cstate: ClientState, ctx: RoundContext
    ) -> Payload:
        charge = mask_charge(cstate.mask_digest, state.ones_digest, state.digest)
        free = cfg.free_initial_download and ctx.round_ == 1
        return sent.get(state, state.params, state.masks, charge, free)

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        due = adjust is not None and adjust.due(ctx.round_)
        return aggregate(state, uplinks, cfg.weighting, due)

    return core.job_algorithm(
        cfg,
        init_server=init_server,
        broadcast=broadcast,
        client_job=partial(client_job, cfg, adjust, shared),
        server_update=server_update,
        init_client=lambda client_id: ClientState(),
        server_metrics=server_metrics,
        uploaded_model=lambda down, up: _codec.decode(up)[0],
        validate_model=validate_model,
        warm_start=warm_start,
        sparse_compute=True,  # masked training: sparse kernels compute the kept weights only
    )


@core.register(Config)
def build(cfg: Config) -> FedAlgorithm[ServerState]:
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
