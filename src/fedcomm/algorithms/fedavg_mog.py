"""FedAvg with a mixture-of-Gaussians prior: the server learns an ensemble of K models.

Louizos et al., "An Expectation-Maximization Perspective on Federated Learning",
Appendix J.2 (Eqs. 47-52). Prior ``p(w_s) = (1/K) Σ_k N(w_k, I/λ)``; down: the K
members (dense, K x the model's bits); up: the client's model (dense, no common reference).

* client (E-step): start from the member with the lowest mean CE on the client's first local
  batch (the first batch of the very schedule local SGD then draws; the paper leaves it open),
  then minimise ``mean CE(w_s) − log Σ_k (1/K) exp(−λ/2 ‖w_s − w_k‖²)`` by local SGD (a loss
  hook). Mean CE (not Eq. 48's sum) puts λ on the per-example scale; explicit SGD needs
  ``lr·λ < 2``.
* server (M-step): ``r_sk = softmax_k(−λ/2 ‖w_s − w_k‖²)`` (log-softmax of float64 distances:
  huge distances give one-hot rows, never NaN); ``m_step``: ``w_k = Σ_s r_sk w_s / Σ_s r_sk``
  (Eq. 52; a member with ``Σ_s r_sk < MIN_MASS`` keeps its value); ``adam``: the ascent direction
  ``(1/S) Σ_s r_sk (w_s − w_k)`` (Eq. 50 over λ, mean over the S clients) through the server
  optimizer, per coordinate of every member. Clients count equally, as in Eq. 52.
* K = 1, ``m_step``: ``r_s1 = 1``, so ``w = (1/S) Σ_s w_s`` (unweighted mean of client models)
  and the local term is ``λ/2 ‖w_s − w‖²``: FedProx(``mu=λ``, ``weighting=uniform``, server SGD
  lr 1) when ``init_noise = 0``.
* init: members = the initial model + i.i.d. N(0, init_noise²) from ``(seed, ALGORITHM, 0)``;
  identical members get identical responsibilities and never separate. Hard EM is sensitive to
  ``λ·init_noise²·N``: small, the members collapse into one model (uniform ``r``); large, one
  member may win every client while the others keep their values. Sweep both.
* prediction: ``global_params`` returns :func:`join_members`; the loop averages the members'
  softmax outputs and logs each member's accuracy (the paper does not say how it predicts).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm.algorithms.core import (
    AlgorithmConfig,
    FedAlgorithm,
    job_algorithm,
    join_members,
    register,
    split_members,
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
from fedcomm.models import dropout
from fedcomm.seeding import Stream, torch_generator
from fedcomm.server_opt import OptState, ServerOptConfig, adam_server
from fedcomm.types import ParamDict

MIN_MASS = 1e-8  # Σ_s r_sk below this: member k had no client this round and keeps its value


class Config(AlgorithmConfig):
    name: Literal["fedavg_mog"] = "fedavg_mog"
    components: int = Field(2, ge=1, description="ensemble size K")
    lam: float = Field(1.0, gt=0, description="precision λ of every mixture component")
    server_rule: Literal["m_step", "adam"] = "m_step"
    server: ServerOptConfig = Field(
        default_factory=adam_server,
        description="server optimizer of the adam rule (unused by m_step)",
    )
    init_noise: float = Field(0.01, ge=0, description="std of the members' initial noise")


@dataclass(frozen=True)
class ServerState:
    members: tuple[ParamDict, ...]  # K models
    opt_state: OptState  # over join_members(members); () for m_step
    entropy: float = 0.0  # mean entropy (nats) of the last round's responsibility rows
    mass: tuple[float, ...] = ()  # (1/S) Σ_s r_sk of the last round, per member


def _flat(models: Sequence[Mapping[str, Tensor]], names: Sequence[str]) -> Tensor:
    return torch.stack([torch.cat([w[n].reshape(-1) for n in names]) for w in models]).double()


def combine(
    models: Sequence[Mapping[str, Tensor]], coeffs: Tensor, names: Sequence[str]
) -> ParamDict:
    """``Σ_s c_s w_s`` per parameter name, for ``coeffs`` of shape ``(S,)``."""
    return {
        n: torch.tensordot(coeffs.to(models[0][n]), torch.stack([w[n] for w in models]), dims=1)
        for n in names
    }


def sq_distances(models: Sequence[Mapping[str, Tensor]], members: Sequence[ParamDict]) -> Tensor:
    """``‖w_s − w_k‖²`` summed over every parameter: ``(S, K)`` float64."""
    names = list(members[0])
    w, m = _flat(models, names), _flat(members, names)  # (S, N), (K, N)
    return torch.stack([((w - m[k]) ** 2).sum(dim=1) for k in range(m.shape[0])], dim=1)


def responsibilities(sq: Tensor, lam: float) -> Tensor:
    """``r_sk = softmax_k(−λ/2 · sq_sk)`` via log-sum-exp: ``(S, K)``, rows sum to 1."""
    return torch.log_softmax(-0.5 * lam * sq, dim=1).exp()


def m_step(
    members: Sequence[ParamDict], models: Sequence[Mapping[str, Tensor]], r: Tensor
) -> tuple[ParamDict, ...]:
    """``w_k = Σ_s r_sk w_s / Σ_s r_sk``; a member with ``Σ_s r_sk < MIN_MASS`` is kept."""
    mass = r.sum(dim=0)  # (K,)
    return tuple(
        old if float(mass[k]) < MIN_MASS else combine(models, r[:, k] / mass[k], list(old))
        for k, old in enumerate(members)
    )


def ascent_direction(
    members: Sequence[ParamDict], models: Sequence[Mapping[str, Tensor]], r: Tensor
) -> tuple[ParamDict, ...]:
    """``(1/S) Σ_s r_sk (w_s − w_k)`` per member (Eq. 50 over λ, mean over the S clients)."""
    r = r / len(models)
    out = []
    for k, m in enumerate(members):
        pulled, mass = combine(models, r[:, k], list(m)), float(r[:, k].sum())
        out.append({n: pulled[n] - mass * m[n] for n in m})
    return tuple(out)


MIX = "mix"  # f"mix{k}.{param}": member k in a client's local job (the prior's centres)


def mixture_program(names: Sequence[str], k: int, lam: float) -> _jobs.LocalProgram:
    """:func:`mixture_hook` as a batchable program: the ``k`` members are read from ``full``
    under :data:`MIX` keys."""
    log_k = math.log(k)

    def hook(full: Mapping[str, Tensor], loss: Tensor) -> Tensor:
        sq = torch.stack(
            [
                torch.stack([((full[n] - full[f"{MIX}{j}.{n}"]) ** 2).sum() for n in names]).sum()
                for j in range(k)
            ]
        )  # (K,)
        return loss - (torch.logsumexp(-0.5 * lam * sq, dim=0) - log_k)

    return _jobs.LocalProgram(loss_hook=hook)


def mixture_hook(members: Sequence[ParamDict], lam: float) -> _local.LossHook:
    """``loss ↦ loss − log Σ_k (1/K) exp(−λ/2 ‖w_s − w_k‖²)`` (maximises the log prior)."""
    program = mixture_program(list(members[0]), len(members), lam)
    centres = {f"{MIX}{j}.{n}": t for j, m in enumerate(members) for n, t in m.items()}
    assert program.loss_hook is not None

    def hook(params: Mapping[str, Tensor], loss: Tensor) -> Tensor:
        return program.loss_hook({**centres, **params}, loss)  # type: ignore[misc]

    return hook


def pick_member(members: Sequence[ParamDict], data: ClientData, ctx: ClientContext) -> int:
    """The member with the lowest mean CE on the first batch local SGD will draw (ties: lowest
    index); the schedule comes from a copy of ``ctx.generator``, which is left untouched."""
    if data.num_examples == 0 or len(members) == 1:
        return 0
    gen = torch.Generator().set_state(ctx.generator.get_state())
    idx = _local.batch_schedule(data.num_examples, ctx.local, gen)[0]
    xb, yb = data.x[idx], data.y[idx]
    with torch.no_grad(), dropout.disabled(ctx.model):  # a measurement: no dropout draw
        losses = [_local.cross_entropy(functional_call(ctx.model, m, (xb,)), yb) for m in members]
    return int(torch.stack(losses).argmin())


def noisy_copies(
    params: ParamDict, k: int, std: float, gen: torch.Generator
) -> tuple[ParamDict, ...]:
    """``k`` copies of ``params`` plus i.i.d. ``N(0, std²)`` noise, drawn member by member."""
    return tuple(
        {
            n: v.detach() + std * torch.randn(v.shape, generator=gen, device=gen.device).to(v)
            for n, v in params.items()
        }
        for _ in range(k)
    )


@register(Config)
def build(cfg: Config) -> FedAlgorithm[ServerState]:
    opt = cfg.server.build()
    adam_rule = cfg.server_rule == "adam"

    def init_server(params: ParamDict, ctx: RoundContext) -> ServerState:
        gen = torch_generator(ctx.seed, Stream.ALGORITHM, 0)
        members = noisy_copies(params, cfg.components, cfg.init_noise, gen)
        return ServerState(members, opt.init(join_members(members)) if adam_rule else ())

    def broadcast(state: ServerState, client_id: int, cstate: None, ctx: RoundContext) -> Payload:
        return encode_dense(join_members(state.members))  # K x dense bits

    programs: dict[tuple[int, int], tuple[nn.Module, _jobs.LocalProgram]] = {}

    def client_job(
        down: Mapping[str, Tensor], cstate: None, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        members = split_members(down)
        k = pick_member(members, data, ctx)
        hit = programs.get((id(ctx.model), len(members)))
        if hit is None or hit[0] is not ctx.model:
            hit = (ctx.model, mixture_program(list(members[0]), len(members), cfg.lam))
            programs[(id(ctx.model), len(members))] = hit
        centres = {f"{MIX}{j}.{n}": t for j, m in enumerate(members) for n, t in m.items()}

        def finish(res: _jobs.JobResult) -> ClientResult:
            picks = {f"fedavg_mog/init_member{j}": float(j == k) for j in range(len(members))}
            return ClientResult(
                uplink=encode_dense(res.live),  # one dense model
                state=None,
                local_params=res.live,
                num_examples=data.num_examples,
                metrics={"train/loss": res.loss, **picks},
            )

        batches = _local.batch_schedule(data.num_examples, ctx.local, ctx.generator)
        return _jobs.new_job(hit[1], members[k], data, ctx.local, batches, finish, frozen=centres)

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        models = [u.tensors for u in uplinks]
        r = responsibilities(sq_distances(models, state.members), cfg.lam)  # (S, K)
        entropy = float(-(r * r.clamp_min(1e-300).log()).sum(dim=1).mean())
        mass = tuple(float(v) for v in r.mean(dim=0))
        if not adam_rule:
            return ServerState(m_step(state.members, models, r), (), entropy, mass)
        direction = join_members(ascent_direction(state.members, models, r))
        joined, opt_state = opt.apply(join_members(state.members), direction, state.opt_state)
        members = split_members(joined)
        return ServerState(tuple(members), opt_state, entropy, mass)

    def server_metrics(state: ServerState) -> dict[str, float]:
        mass = {f"member{k}_mass": m for k, m in enumerate(state.mass)}  # -> fedavg_mog/...
        return {"responsibility_entropy": state.entropy, **mass}

    return job_algorithm(
        cfg,
        init_server=init_server,
        broadcast=broadcast,
        client_job=client_job,
        server_update=server_update,
        global_params=lambda s: join_members(s.members),
        server_metrics=server_metrics,
        uploaded_model=lambda down, up: dict(up),
    )
