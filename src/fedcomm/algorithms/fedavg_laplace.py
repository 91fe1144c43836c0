"""FedAvg with a Laplace prior: an L1-proximal client and a coordinate-wise median server.

Louizos et al., "An Expectation-Maximization Perspective on Federated Learning",
Appendix J.1 (Eqs. 42-46). The local prior ``p(w_s|w) ∝ exp(−λ Σ_j |w_sj − w_j|)``
turns hard EM into:

* client (E-step): minimise ``mean CE(w_s) + λ Σ_j |w_sj − w_j|`` from ``w_s = w``, as local
  SGD on the CE followed after every step by the proximal (soft-threshold) step toward ``w``:
  ``w_s ← w + soft(w_s − w, lr·λ)`` with ``soft(d, τ) = sign(d)·max(|d| − τ, 0)``. Coordinates
  within ``lr·λ`` of ``w`` land *exactly* on ``w`` (the paper's "several local parameters will
  be exactly equal to the server parameters"). ``λ = 0`` is FedAvg's local training exactly.
  Mean CE (not the paper's sum) puts λ on the per-example scale, as for every local loss here.
* server (M-step), ``server_rule``:
  ``median``: ``w_j = median_s(w_sj)`` over the round's clients (Eq. 46), computed as
  ``w + median_s(Δ_sj)``; an even count takes the mean of the two middle values (the midpoint of
  the set of minimisers of ``Σ_s |w_sj − w_j|``). Closed form: ``server`` and ``weighting``
  are ignored. ``gradient``: the ascent direction ``g_j = λ·mean_s sign(w_sj − w_j)`` (Eq. 45,
  mean over clients as for FedSparse, weighted by ``weighting``, default uniform like Eq. 45's
  plain sum) goes to the server optimizer (default Adam, lr 1e-3, as the paper uses for every
  method; Adam makes λ's scale irrelevant, and ``λ = 0`` leaves ``w`` fixed).

Communication is FedAvg's: the dense model down, the dense delta ``Δ_s = w_s − w`` up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor

from fedcomm.algorithms import fedavg
from fedcomm.algorithms.core import (
    AlgorithmConfig,
    FedAlgorithm,
    client_weights,
    clone_params,
    job_algorithm,
    register,
    subtract,
    weighted_mean,
)
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.context import (
    ClientContext,
    ClientData,
    ClientResult,
    RoundContext,
    Uplink,
)
from fedcomm.comm.codecs import encode_dense
from fedcomm.comm.payload import Payload
from fedcomm.server_opt import ServerOptConfig, adam_server, apply_step
from fedcomm.types import ParamDict


class Config(AlgorithmConfig):
    name: Literal["fedavg_laplace"] = "fedavg_laplace"
    lam: float = Field(1e-3, ge=0, description="Laplace prior rate λ (0: FedAvg's local step)")
    server_rule: Literal["median", "gradient"] = "median"
    server: ServerOptConfig = Field(
        default_factory=adam_server,
        description="server optimizer of the gradient rule (unused by median)",
    )
    weighting: Literal["num_examples", "uniform"] = Field(
        "uniform", description="client weights of the gradient rule's mean (unused by median)"
    )


ServerState = fedavg.ServerState  # FedAvg's: w and the server optimizer's state (() for median)


def soft_threshold(d: Tensor, tau: float) -> Tensor:
    """``sign(d)·max(|d| − τ, 0)``; exactly 0 where ``|d| ≤ τ``."""
    return d - d.clamp(-tau, tau)


def prox_toward(anchor: Mapping[str, Tensor], tau: float) -> _local.PostStep:
    """The L1 proximal step ``w_s ↦ w + soft(w_s − w, τ)`` (``τ = lr·λ``), as a post-step."""

    def post_step(params: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: anchor[k] + soft_threshold(v - anchor[k], tau) for k, v in params.items()}

    return post_step


def median(tensors: Sequence[Tensor]) -> Tensor:
    """Coordinate-wise median; an even count gives the mean of the two middle values."""
    ordered = torch.stack(list(tensors)).sort(dim=0).values  # (S, ...)
    n = ordered.shape[0]
    if n % 2:
        return ordered[n // 2]
    return 0.5 * (ordered[n // 2 - 1] + ordered[n // 2])


def sign_direction(
    deltas: Sequence[Mapping[str, Tensor]], weights: Sequence[float], lam: float
) -> ParamDict:
    """The ascent direction ``λ·Σ_s a_s sign(Δ_s) / Σ_s a_s`` of Eq. 45 (mean over clients)."""
    signs = [{k: v.sign() for k, v in d.items()} for d in deltas]
    return {k: lam * v for k, v in weighted_mean(signs, weights).items()}


@register(Config)
def build(cfg: Config) -> FedAlgorithm[ServerState]:
    opt = cfg.server.build()
    gradient_rule = cfg.server_rule == "gradient"

    def init_server(params: ParamDict, ctx: RoundContext) -> ServerState:
        return ServerState(clone_params(params), opt.init(params) if gradient_rule else ())

    def broadcast(state: ServerState, client_id: int, cstate: None, ctx: RoundContext) -> Payload:
        return encode_dense(state.params)

    programs: dict[float, _jobs.LocalProgram] = {}

    def program_for(tau: float) -> _jobs.LocalProgram:
        """The L1 proximal post-step toward each client's anchor ``w`` (``frozen``)."""
        if tau not in programs:

            def post_step(
                live: dict[str, Tensor], frozen: Mapping[str, Tensor], before: Mapping[str, Tensor]
            ) -> dict[str, Tensor]:
                anchor = {k: frozen[fedavg.ANCHOR + k] for k in live}
                return prox_toward(anchor, tau)(live)

            programs[tau] = _jobs.LocalProgram(post_step=post_step if tau > 0 else None)
        return programs[tau]

    def client_job(
        down: Mapping[str, Tensor], cstate: None, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        def finish(res: _jobs.JobResult) -> ClientResult:
            delta = subtract(res.live, down)
            tied = sum(int((v == 0).sum()) for v in delta.values())
            numel = sum(v.numel() for v in delta.values())
            return ClientResult(
                uplink=encode_dense(delta),
                state=None,
                local_params=res.live,
                num_examples=data.num_examples,
                metrics={"train/loss": res.loss, "fedavg_laplace/tied_fraction": tied / numel},
            )

        tau = ctx.local.lr * cfg.lam if cfg.lam > 0 else 0.0
        batches = _local.batch_schedule(data.num_examples, ctx.local, ctx.generator)
        frozen = fedavg.anchors(down) if tau > 0 else {}  # w, the proximal step's centre
        return _jobs.new_job(
            program_for(tau), down, data, ctx.local, batches, finish, frozen=frozen
        )

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        deltas = [u.tensors for u in uplinks]
        if not gradient_rule:
            mid = {k: median([d[k] for d in deltas]) for k in state.params}
            return ServerState(apply_step(state.params, mid), ())
        direction = sign_direction(deltas, client_weights(uplinks, cfg.weighting), cfg.lam)
        return ServerState(*opt.apply(state.params, direction, state.opt_state))

    return job_algorithm(
        cfg,
        init_server=init_server,
        broadcast=broadcast,
        client_job=client_job,
        server_update=server_update,
        uploaded_model=fedavg.add_delta,
    )
