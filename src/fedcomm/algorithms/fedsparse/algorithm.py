"""FedSparse: federated spike-and-slab sparsity over groups, trained by hard EM.

Louizos, Reisser, Soriaga, Welling, "An Expectation-Maximization Perspective on Federated
Learning" (arXiv:2111.10192, 2021), Sections 3-3.2, Algorithms 1-2, Appendices A, G-I.

Gates per group g (conv filter; linear input feature; the output layer's inputs unless
``prune_output: false``): ``θ_g = σ((‖w_g‖ − softplus(v_g))/T)`` on the server, and
``π_sg = σ((sg‖w_sg‖ − softplus(v_sg))/T)`` on client s (norms detached; :mod:`.gates`).

Client (one local epoch): minimise ``CE(w_s ⊙ z) + λ0 Σ_g |g| π_g
− c_CE Σ_g [π_g log θ_g + (1 − π_g) log(1 − θ_g)] + (λ/2) Σ_g π_g ‖w_sg − w_g‖²`` with
hard-concrete gates ``z`` (β = 2/3, γ = −0.1, ζ = 1.1; log α = logit π), SGD on ``w_s`` and
Adamax on ``v_s`` (:mod:`.penalties`, :mod:`.local`); then draw ``z_s ~ Bern(π_s)``
and upload ``z_s`` (1 bit per surviving group) and the weights of the groups with ``z = 1`` (plus
ungated parameters).

Server (Algorithm 1): ``g_w = mean_s z_s ⊙ (ŵ_s − w)`` -> Adam; ``g_v = mean_s −(z_s − θ) σ(v)/T``
-> Adamax (lr 1e-2); then groups with ``θ ≤ prune_threshold`` are pruned for good (weights and
Adam moments zeroed; :mod:`.server`). Down: surviving weights, ``v`` of surviving groups,
1 bit per group (:mod:`.messages`).

Choices the paper leaves open (our defaults): mean cross-entropy as the likelihood
term (``data_term: shard_sum`` is Eq. 17's sum over the shard's N_s examples instead: the
objective divided by N_s, i.e. the penalties λ0, c_CE and λ divided by the client's N_s, the
reading of the L0 reference code, which divides its penalty by the dataset size);
``log α = logit π`` (``gate_mapping: l0_shift`` subtracts 1.599, Eq. 41); the plain mean
over the sampled clients on the server (``weighting``). ``server_prune: false`` is the paper's
no-pruning ablation: nothing is pruned, so the dense server model is evaluated and sent.
``lambda0_from_round: R`` (an ablation, not in the paper) sets λ0 = 0 before round R, so the
gates meet the L0 cost only once the model has trained. The TV metrics (``fedsparse/tv_mean``,
``tv_max``: |π_sg − θ_g|, π at upload, θ at round start) are taken over the round's clients and
the *surviving* groups (pruned groups have TV ≈ 0 and would only dilute the mean). A group whose
initial norm is below ``T·logit(init_theta)`` (≈ 4.6e-3) cannot start at ``init_theta``; its
``v`` is clamped (θ between 0.5 and 0.99).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from pydantic import ConfigDict, Field
from torch import Tensor

from fedcomm.algorithms import core
from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.context import (
    ClientContext,
    ClientData,
    ClientResult,
    RoundContext,
    Uplink,
)
from fedcomm.algorithms.core.reuse import Reused
from fedcomm.algorithms.fedsparse.gates import L0_SHIFT, gate_probs, initial_v, sample_z
from fedcomm.algorithms.fedsparse.local import (
    GATE,
    Programs,
    StepRule,
    gated_groups,
    penalty_scale,
    step_constants,
    step_noise,
)
from fedcomm.algorithms.fedsparse.messages import decode_downlink, encode_downlink, encode_upload
from fedcomm.algorithms.fedsparse.server import (
    prune,
    server_metrics,
    uploaded_gates,
    v_gradient,
    weight_gradient,
    zero_pruned,
)
from fedcomm.comm.payload import Payload
from fedcomm.models.groups import GroupSpec
from fedcomm.server_opt import OptState, ServerOptConfig, Transform, adam_server, adamax
from fedcomm.types import ParamDict


class Config(AlgorithmConfig):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: Literal["fedsparse"] = "fedsparse"
    lambda0: float = Field(5e-6, ge=0, description="L0 cost per parameter of a kept group")
    lambda0_from_round: int = Field(
        1, ge=1, description="ablation: λ0 = 0 in the rounds before this one (1: from the start)"
    )
    ce_scale: float = Field(1e-4, ge=0, description="c_CE: weight of the gate prior term")
    data_term: Literal["mean", "shard_sum"] = Field(
        "mean",
        description="the likelihood term of Eq. 17: mean (the minibatch mean cross-entropy beside "
        "λ0, c_CE and λ as they are; the default, the paper leaves it open) or shard_sum (the "
        "sum over the shard's N_s examples of Eqs. 17/41, N_s × the minibatch mean; the objective "
        "is divided by N_s so that SGD's lr keeps its per-example meaning: mean CE + (the "
        "penalties)/N_s)",
    )
    lam: float = Field(0.0, ge=0, alias="lambda", description="drift λ (FedProx-like) on π")
    T: float = Field(1e-3, gt=0, description="gate temperature")
    init_theta: float = Field(0.99, gt=0, lt=1, description="initial gate probability θ")
    prune_threshold: float = Field(0.1, ge=0, lt=1, description="server prunes θ ≤ this")
    server_prune: bool = True
    prune_output: bool = True
    gate_lr: float = Field(1e-3, gt=0, description="client Adamax lr on v")
    gate_optimizer: Literal["adamax", "sgd"] = Field(
        "adamax",
        description="client optimizer on v: Adamax (the paper, Appendix A: sign-driven) or, as "
        "a diagnosis, SGD with lr gate_lr (the size of the gradient, so of λ0, moves v)",
    )
    gate_server_lr: float = Field(1e-2, gt=0, description="server Adamax lr on v")
    gate_mapping: Literal["logit_pi", "l0_shift"] = Field(
        "logit_pi", description="log α = logit π (default), or logit π − 1.599 (Eq. 41)"
    )
    force_gates_on: bool = Field(False, description="ablation: z ≡ 1, no pruning")
    gate_at: Literal["auto", "weights"] = Field(
        "auto",
        description="where the local forward pass applies the gates z: auto (a linear layer's "
        "input-feature gates on its input x ⊙ z when that is smaller than its weight, the same "
        "function) or weights (always W ⊙ z, the equations' literal form)",
    )
    weighting: Literal["uniform", "num_examples"] = "uniform"
    server: ServerOptConfig = Field(default_factory=adam_server)


@dataclass(frozen=True)
class ServerState:
    params: ParamDict  # w; pruned groups are exactly zero
    v: ParamDict  # (count,) per group spec
    alive: ParamDict  # (count,) bool per group spec; pruned groups never come back
    w_opt: OptState
    v_opt: OptState
    specs: tuple[GroupSpec, ...]


def step_rule(cfg: Config) -> StepRule:
    shift = L0_SHIFT if cfg.gate_mapping == "l0_shift" else 0.0
    return StepRule(
        cfg.T,
        shift,
        cfg.force_gates_on,
        cfg.ce_scale,
        cfg.lam,
        cfg.gate_lr,
        cfg.gate_at,
        cfg.prune_output,
        cfg.gate_optimizer,
    )


# ---- Algorithm 1: the server -----------------------------------------------------------------


def initial_state(
    params: ParamDict, specs: tuple[GroupSpec, ...], cfg: Config, w_opt: Transform, v_opt: Transform
) -> ServerState:
    """Initialize ``w`` (the model) and ``v`` (every θ at ``init_theta``). Algorithm 1 line 1"""
    v = initial_v(params, specs, cfg.T, cfg.init_theta)
    dev = next(iter(params.values())).device
    alive = {s.name: torch.ones(s.count, dtype=torch.bool, device=dev) for s in specs}
    w = core.clone_params(params)
    return ServerState(w, v, alive, w_opt.init(w), v_opt.init(v), specs)


def server_step(
    state: ServerState, uplinks: Sequence[Uplink], cfg: Config, w_opt: Transform, v_opt: Transform
) -> ServerState:
    """One M-step: ``w ← Adam(g_w)``, ``v ← Adamax(g_v)``, then prune ``θ ≤ ε``. Algorithm 1"""
    dev = next(iter(state.params.values())).device
    weights = torch.tensor(core.client_weights(uplinks, cfg.weighting), device=dev)
    weights = weights / weights.sum()  # p_s
    theta = gate_probs(state.params, state.v, state.specs, cfg.T)  # lines 3-4
    uploads = [u.tensors for u in uplinks]
    zs = uploaded_gates(uploads, state.alive, state.specs)  # line 8
    g_w = weight_gradient(state.params, uploads, zs, weights, state.specs)  # line 9
    params, w_opt_state = w_opt.apply(state.params, g_w, state.w_opt)  # line 12
    g_v = {  # line 10
        s.name: v_gradient([z[s.name] for z in zs], theta[s.name], state.v[s.name], cfg.T, weights)
        * state.alive[s.name]
        for s in state.specs
    }
    v_step, v_opt_state = v_opt.update(g_v, state.v_opt)  # line 12
    v = {k: state.v[k] + v_step[k] * state.alive[k] for k in state.v}
    alive = dict(state.alive)
    if cfg.server_prune and not cfg.force_gates_on:  # lines 3-5, for the next round
        alive = prune(alive, gate_probs(params, v, state.specs, cfg.T), cfg.prune_threshold)
    params, w_opt_state = zero_pruned(params, w_opt_state, alive, state.specs)  # line 5
    return ServerState(params, v, alive, w_opt_state, v_opt_state, state.specs)


# ---- Algorithm 2: a client -------------------------------------------------------------------


@dataclass(frozen=True)
class Received:
    """A client's view of the downlink, the same for every client of a round."""

    specs: tuple[GroupSpec, ...]
    alive: ParamDict  # (count,) bool per spec
    w: ParamDict  # the server's weights (pruned groups 0)
    v: ParamDict  # (count,) per spec (pruned groups 0)
    theta: ParamDict  # θ, held constant during the round
    frozen: dict[str, Tensor]  # the local step's per-client tensors
    pruned: bool  # some group is pruned


def receive(
    down: Mapping[str, Tensor],
    specs: tuple[GroupSpec, ...],
    shapes: ParamDict,
    cfg: Config,
    round_: int,
) -> Received:
    """Get ``w, v`` from the server; ``θ``; the step's constants. Algorithm 2 lines 1-2"""
    alive, w, v = decode_downlink(down, specs, shapes)
    theta = gate_probs(w, v, specs, cfg.T)
    l0 = cfg.lambda0 if round_ >= cfg.lambda0_from_round else 0.0  # (lambda0_from_round)
    frozen = step_constants(theta, alive, w, specs, l0, anchored=bool(cfg.lam))
    pruned = not all(bool(a.all()) for a in alive.values())
    return Received(specs, alive, w, v, theta, frozen, pruned)


def upload(
    seen: Received, gen: torch.Generator, cfg: Config, num_examples: int, res: _jobs.JobResult
) -> ClientResult:
    """``π_s``; ``z_s ~ Bern(π_s)``; return ``z_s`` (over the surviving groups) and ``z_s ⊙ w_s``
    (the kept groups' weights), with the TV and upload metrics. Algorithm 2 lines 13-15"""
    specs, alive = seen.specs, seen.alive
    w_s = {k: res.live[k] for k in seen.w}
    v_s = {s.name: res.live[GATE + s.name] for s in specs}
    pis = {k: p.detach() for k, p in gate_probs(res.live, v_s, specs, cfg.T).items()}
    z = {s.name: sample_z(pis[s.name], gen, cfg.force_gates_on) & alive[s.name] for s in specs}
    payload, uploaded = encode_upload(w_s, z, alive, specs)
    tv = torch.cat([(pis[s.name] - seen.theta[s.name]).abs()[alive[s.name]] for s in specs])
    n_alive = sum(int(a.sum()) for a in alive.values())
    metrics = {
        "train/loss": res.loss,
        "fedsparse/tv_mean": float(tv.mean()) if tv.numel() else 0.0,
        "fedsparse/tv_max": float(tv.max()) if tv.numel() else 0.0,
        "fedsparse/upload_fraction": sum(int(m.sum()) for m in z.values()) / max(1, n_alive),
    }
    return ClientResult(payload, None, uploaded, num_examples, metrics)


def make(cfg: Config) -> FedAlgorithm[ServerState]:
    w_opt: Transform = cfg.server.build()
    v_opt: Transform = adamax(cfg.gate_server_lr)
    programs = Programs(step_rule(cfg))  # each model's local program, built once
    sent: Reused[Payload] = Reused()  # the current server state's downlink, encoded once
    decoded: Reused[Received] = Reused()  # the round's downlink, as every client sees it

    def init_server(params: ParamDict, ctx: RoundContext) -> ServerState:
        specs = gated_groups(ctx.model, cfg.prune_output)
        return initial_state(params, specs, cfg, w_opt, v_opt)

    def broadcast(state: ServerState, client_id: int, cstate: Any, ctx: RoundContext) -> Payload:
        encode = partial(encode_downlink, state.params, state.v, state.alive, state.specs)
        return sent.get([state], encode)

    def received(down: Mapping[str, Tensor], ctx: ClientContext) -> Received:
        """Decoded for the round's first client and reused (keyed by the decoded tensors, the
        model and the round)."""
        specs, shapes = programs.structure(ctx.model)
        view = partial(receive, down, specs, shapes, cfg, ctx.round_)
        return decoded.get([ctx.model, *down.values()], view, also=ctx.round_)

    def client_job(
        down: Mapping[str, Tensor], cstate: Any, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        seen = received(down, ctx)
        rows = ctx.local.batch_size * math.prod(data.y.shape[1:])  # rows a batch feeds a layer
        program = programs.get(ctx.model, seen.pruned, rows)  # lines 4-12
        gen = ctx.generator
        batches = _local.batch_schedule(data.num_examples, ctx.local, gen)
        steps = len(batches) if not cfg.force_gates_on else 0
        noise = iter(step_noise(seen.specs, steps, gen, seen.w))  # u of each group, per step

        def draws() -> dict[str, Tensor]:  # the hard-concrete noise u of each group, in order
            return next(noise, {})

        start = {**seen.w, **{GATE + s.name: seen.v[s.name] for s in seen.specs}}  # line 3
        finish = partial(upload, seen, gen, cfg, data.num_examples)  # lines 13-15
        frozen = seen.frozen
        if cfg.data_term == "shard_sum":  # Eq. 17 / N_s: the penalties weigh 1/N_s of the mean CE
            frozen = {**frozen, **penalty_scale(data.num_examples, next(iter(seen.w.values())))}
        return _jobs.new_job(
            program, start, data, ctx.local, batches, finish, frozen=frozen, draws=draws
        )

    return core.job_algorithm(
        cfg,
        init_server=init_server,
        broadcast=broadcast,
        client_job=client_job,
        server_update=lambda state, uplinks, ctx: server_step(state, uplinks, cfg, w_opt, v_opt),
        server_metrics=lambda s: server_metrics(s.params, s.v, s.alive, s.specs, cfg.T),
    )


@core.register(Config)
def build(cfg: Config) -> FedAlgorithm[ServerState]:
    return make(cfg)
