"""FedSparse: federated spike-and-slab sparsity over groups, trained by hard EM.

Louizos, Reisser, Soriaga, Welling, "An Expectation-Maximization Perspective on Federated
Learning" (arXiv:2111.10192), Sections 3-3.2, Algorithms 1-2, Appendices A, G-I; implementation
choices from ``specs/fedsparse-fedbiad.md`` §1.2-1.5.

Gates per group g (conv filter; linear input feature; the output layer's inputs unless
``prune_output: false``): ``θ_g = σ((‖w_g‖ − softplus(v_g))/T)`` on the server, and
``π_sg = σ((sg‖w_sg‖ − softplus(v_sg))/T)`` on client s (norms detached).

Client (one local epoch): minimise ``CE(w_s ⊙ z) + λ0 Σ_g |g| π_g
− c_CE Σ_g [π_g log θ_g + (1 − π_g) log(1 − θ_g)] + (λ/2) Σ_g π_g ‖w_sg − w_g‖²`` with
hard-concrete gates ``z`` (β = 2/3, γ = −0.1, ζ = 1.1; log α = logit π), SGD on ``w_s`` and
Adamax on ``v_s``; then draw ``z_s ~ Bern(π_s)`` and upload ``z_s`` (1 bit per surviving group)
and the weights of the groups with ``z = 1`` (plus ungated parameters).

Server (Algorithm 1): ``g_w = mean_s z_s ⊙ (ŵ_s − w)`` -> Adam; ``g_v = mean_s −(z_s − θ) σ(v)/T``
-> Adamax (lr 1e-2); then groups with ``θ ≤ prune_threshold`` are pruned for good (weights and
Adam moments zeroed). Down: surviving weights, ``v`` of surviving groups, 1 bit per group.

Choices (spec [AMB] recommendations are the defaults): mean cross-entropy as the likelihood
term; ``log α = logit π`` (``gate_mapping: l0_shift`` subtracts 1.599, Eq. 41); the plain mean
over the sampled clients on the server (``weighting``). ``server_prune: false`` is the paper's
no-pruning ablation: nothing is pruned, so the dense server model is evaluated and sent.
``lambda0_from_round: R`` (an ablation, not in the paper) sets λ0 = 0 before round R, so the
gates meet the L0 cost only once the model has trained. The
TV metrics (``fedsparse/tv_mean``, ``tv_max``: |π_sg − θ_g|, π at upload, θ at round start)
are taken over the round's clients and the *surviving* groups (pruned groups have TV ≈ 0 and
would only dilute the mean). A group whose initial norm is below ``T·logit(init_theta)``
(≈ 4.6e-3) cannot start at ``init_theta``; its ``v`` is clamped (θ between 0.5 and 0.99).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from pydantic import ConfigDict, Field
from torch import Tensor

from fedcomm.algorithms import _jobs, _local
from fedcomm.algorithms._grouped import (
    decode_groups,
    encode_groups,
    entry_masks,
    member_axes,
    scatter_mask,
)
from fedcomm.algorithms._reuse import Reused
from fedcomm.algorithms.base import (
    AlgorithmConfig,
    ClientContext,
    ClientData,
    ClientResult,
    FedAlgorithm,
    RoundContext,
    Uplink,
    client_weights,
    register,
)
from fedcomm.comm.payload import Dense, Payload
from fedcomm.models.groups import (
    GroupSpec,
    group_norms,
    group_norms_detached,
    group_sizes,
    groups,
)
from fedcomm.server_opt import OptState, ServerOptConfig, Transform, adamax, apply_step
from fedcomm.types import Params

# per-client tensors of the local step (LocalJob.frozen / live keys)
GATE, NOISE, THETA, COST, ALIVE, ANCHOR = "gate.", "u.", "theta.", "l0.", "alive.", "anchor."
LOGIT = "logit."  # logit π of a group, computed once a step by the forward pass
INPUT_GATE = "in_gate."  # z of a group gated at its layer's input (forward pass only)
BETA, GAMMA, ZETA = 2 / 3, -0.1, 1.1  # hard-concrete (Louizos et al. 2018, the L0 paper)
L0_SHIFT = -BETA * math.log(-GAMMA / ZETA)  # ≈ 1.599: P(z > 0) = σ(log α + L0_SHIFT)


class Config(AlgorithmConfig):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    name: Literal["fedsparse"] = "fedsparse"
    lambda0: float = Field(5e-6, ge=0, description="L0 cost per parameter of a kept group")
    lambda0_from_round: int = Field(
        1, ge=1, description="ablation: λ0 = 0 in the rounds before this one (1: from the start)"
    )
    ce_scale: float = Field(1e-4, ge=0, description="c_CE: weight of the gate prior term")
    lam: float = Field(0.0, ge=0, alias="lambda", description="drift λ (FedProx-like) on π")
    T: float = Field(1e-3, gt=0, description="gate temperature")
    init_theta: float = Field(0.99, gt=0, lt=1, description="initial gate probability θ")
    prune_threshold: float = Field(0.1, ge=0, lt=1, description="server prunes θ ≤ this")
    server_prune: bool = True
    prune_output: bool = True
    gate_lr: float = Field(1e-3, gt=0, description="client Adamax lr on v")
    gate_server_lr: float = Field(1e-2, gt=0, description="server Adamax lr on v")
    gate_mapping: Literal["logit_pi", "l0_shift"] = Field(
        "logit_pi", description="log α = logit π (spec Rec), or logit π − 1.599 (Eq. 41)"
    )
    force_gates_on: bool = Field(False, description="ablation: z ≡ 1, no pruning")
    gate_at: Literal["auto", "weights"] = Field(
        "auto",
        description="where the local forward pass applies the gates z: auto (a linear layer's "
        "input-feature gates on its input x ⊙ z when that is smaller than its weight, the same "
        "function) or weights (always W ⊙ z, the equations' literal form)",
    )
    weighting: Literal["uniform", "num_examples"] = "uniform"
    server: ServerOptConfig = Field(
        default_factory=lambda: ServerOptConfig(optimizer="adam", lr=1e-3)
    )


@dataclass(frozen=True)
class ServerState:
    params: Params  # w; pruned groups are exactly zero
    v: Params  # (count,) per group spec
    alive: Params  # (count,) bool per group spec; pruned groups never come back
    w_opt: OptState
    v_opt: OptState
    specs: tuple[GroupSpec, ...]


def _softplus_inv(y: Tensor) -> Tensor:
    return y + torch.log(-torch.expm1(-y))  # log(exp(y) − 1), stable


def gate_logits(
    params: Mapping[str, Tensor], v: Mapping[str, Tensor], spec: GroupSpec, T: float
) -> Tensor:
    """``(‖w_g‖ − softplus(v_g)) / T`` with the norm detached: logit θ (or logit π)."""
    return (group_norms_detached(params, spec) - F.softplus(v[spec.name])) / T  # (count,)


def hard_concrete(log_alpha: Tensor, u: Tensor) -> Tensor:
    """Stretched, clamped binary-concrete sample in [0, 1] (Louizos et al. 2018, Eq. 10)."""
    s = torch.sigmoid((torch.log(u) - torch.log1p(-u) + log_alpha) / BETA)
    return torch.clamp(s * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def v_gradient(
    z: Sequence[Tensor], theta: Tensor, v: Tensor, T: float, weights: Tensor | None = None
) -> Tensor:
    """Closed-form ascent direction for v: ``Σ_s p_s · −(z_s − θ) σ(v) / T`` (Algorithm 1) with
    client weights ``p_s`` summing to 1 (default: the plain mean over clients)."""
    per_client = torch.stack([-(zs.float() - theta) * torch.sigmoid(v) / T for zs in z])
    p = torch.full((len(z),), 1 / len(z), device=v.device) if weights is None else weights
    return (p.reshape(-1, 1) * per_client).sum(0)


def _specs(model: torch.nn.Module | None, cfg: Config) -> tuple[GroupSpec, ...]:
    if model is None:
        raise ValueError("fedsparse needs the model structure in the round context")
    return tuple(s for s in groups(model) if cfg.prune_output or not s.is_output)


def make(cfg: Config) -> FedAlgorithm:
    w_opt: Transform = cfg.server.build()
    v_opt: Transform = adamax(cfg.gate_server_lr)
    shift = L0_SHIFT if cfg.gate_mapping == "l0_shift" else 0.0

    def thetas(
        params: Mapping[str, Tensor], v: Mapping[str, Tensor], specs: Sequence[GroupSpec]
    ) -> Params:
        return {s.name: torch.sigmoid(gate_logits(params, v, s, cfg.T)) for s in specs}

    def init_server(params: Params, ctx: RoundContext) -> ServerState:
        specs = _specs(ctx.model, cfg)
        logit0 = math.log(cfg.init_theta / (1 - cfg.init_theta))
        v = {
            s.name: _softplus_inv(
                (group_norms(params, s) - cfg.T * logit0).clamp_min(1e-6)
            ).detach()
            for s in specs
        }
        dev = next(iter(params.values())).device
        alive = {s.name: torch.ones(s.count, dtype=torch.bool, device=dev) for s in specs}
        w = {k: t.detach().clone() for k, t in params.items()}
        return ServerState(w, v, alive, w_opt.init(w), v_opt.init(v), specs)

    sent: Reused[Payload] = Reused()  # the current server state's downlink, encoded once

    def broadcast(state: ServerState, client_id: int, cstate: Any, ctx: RoundContext) -> Payload:
        def encode() -> Payload:
            entries = encode_groups(state.params, state.specs, state.alive, send_masks=True)
            for s in state.specs:  # v of the surviving groups only
                entries[f"v/{s.name}"] = Dense(state.v[s.name][state.alive[s.name]])
            return Payload(entries)

        return sent.get([state], encode)

    programs: dict[
        tuple[int, bool, frozenset[str]], tuple[torch.nn.Module, _jobs.LocalProgram]
    ] = {}
    structures: dict[int, tuple[torch.nn.Module, tuple[GroupSpec, ...], Params]] = {}

    def structure(model: torch.nn.Module) -> tuple[tuple[GroupSpec, ...], Params]:
        """The model's groups and parameter shapes (looked up once per model, not per client)."""
        hit = structures.get(id(model))
        if hit is None or hit[0] is not model:
            shapes = {k: p.detach() for k, p in model.named_parameters()}
            hit = (model, _specs(model, cfg), shapes)
            structures[id(model)] = hit
        return hit[1], hit[2]

    def program_for(model: torch.nn.Module, pruned: bool, rows: int) -> _jobs.LocalProgram:
        """The local step's program for this structure; every client-specific tensor (θ, |g|,
        alive masks, w for the drift, the gate noise u) is read from ``full``. ``pruned``: some
        group is pruned, so a post-step keeps its weights at 0 (with every group alive that
        projection is the identity, and leaving it out saves a full-size pass per step).
        ``rows``: rows a batch feeds each layer; a linear layer's input-feature gates are applied
        to its input rather than its weight where that is smaller (:func:`input_gated`)."""
        specs = _specs(model, cfg)
        at_input = frozenset(
            s.name for s in specs if cfg.gate_at == "auto" and input_gated(model, s, rows)
        )
        hit = programs.get((id(model), pruned, at_input))
        if hit is not None and hit[0] is model:
            return hit[1]

        def gates(full: Mapping[str, Tensor], spec: GroupSpec) -> Tensor:  # π_g
            logits = full.get(LOGIT + spec.name)  # computed by forward_params this step
            if logits is None:
                logits = gate_logits(full, {spec.name: full[GATE + spec.name]}, spec, cfg.T)
            return torch.sigmoid(logits)

        def forward_params(full: dict[str, Tensor]) -> dict[str, Tensor]:  # w_s ⊙ z
            out = dict(full)
            for s in specs:
                if cfg.force_gates_on:
                    break
                logits = gate_logits(full, {s.name: full[GATE + s.name]}, s, cfg.T)
                out[LOGIT + s.name] = logits  # logit π, for the penalties of the same step
                z = hard_concrete(logits - shift, full[NOISE + s.name]) * full[ALIVE + s.name]
                if s.name in at_input:  # x ⊙ z into the layer: the same as W ⊙ z, cheaper
                    out[INPUT_GATE + s.name] = z
                    continue
                for name, axis in s.members:
                    shape = [1] * full[name].dim()
                    shape[axis] = s.count
                    out[name] = out[name] * z.reshape(shape)
            return out

        def penalties(full: Mapping[str, Tensor], loss: Tensor) -> Tensor:
            total = loss
            for s in specs:
                pi, th = gates(full, s), full[THETA + s.name].clamp(1e-6, 1 - 1e-6)
                total = total + (full[COST + s.name] * pi).sum()  # λ0 |g| π_g
                total = total - cfg.ce_scale * (pi * th.log() + (1 - pi) * (1 - th).log()).sum()
                if cfg.lam:
                    drift = {n: full[n] - full[ANCHOR + n] for n, _ in s.members}
                    total = total + 0.5 * cfg.lam * (pi * group_norms(drift, s) ** 2).sum()
            return total

        axes = member_axes(specs)

        def keep_pruned(
            live: dict[str, Tensor], frozen: Mapping[str, Tensor], before: Mapping[str, Tensor]
        ) -> dict[str, Tensor]:  # pruned groups stay 0: w ⊙ alive, broadcast along the axis
            out = dict(live)
            for name, (spec, axis) in axes.items():
                shape = [1] * live[name].dim()
                shape[axis] = spec.count
                out[name] = live[name] * frozen[ALIVE + spec.name].reshape(shape)
            return out

        aux = _local.AuxAdamax(frozenset(GATE + s.name for s in specs), lr=cfg.gate_lr)
        program = _jobs.LocalProgram(
            loss_hook=penalties,
            post_step=keep_pruned if pruned else None,
            param_map=forward_params,
            aux=aux,
            input_gates=tuple(
                (layer_of(s), INPUT_GATE + s.name) for s in specs if s.name in at_input
            ),
        )
        programs[(id(model), pruned, at_input)] = (model, program)
        return program

    decoded: Reused[tuple[Any, ...]] = Reused()  # the round's downlink, as every client sees it

    def received(down: Mapping[str, Tensor], ctx: ClientContext) -> tuple[Any, ...]:
        """A client's view of the downlink: the specs, alive masks, ``w``, ``v``, ``θ`` (held
        constant during the round), the step's frozen tensors and whether a group is pruned.
        Every client of a round decodes the same payload into the same tensors, so this is
        computed for the first and reused (keyed by the decoded tensors, the model and the
        round)."""
        return decoded.get([ctx.model, *down.values()], lambda: view(down, ctx), also=ctx.round_)

    def view(down: Mapping[str, Tensor], ctx: ClientContext) -> tuple[Any, ...]:
        specs, shapes = structure(ctx.model)
        alive = {s.name: down[f"mask/{s.name}"].bool() for s in specs}  # (count,) per spec
        w = decode_groups(down, shapes, specs, alive)
        v = {
            s.name: torch.zeros(s.count, device=alive[s.name].device).masked_scatter(
                alive[s.name], down[f"v/{s.name}"]
            )
            for s in specs
        }
        theta = thetas(w, v, specs)
        l0 = cfg.lambda0 if ctx.round_ >= cfg.lambda0_from_round else 0.0
        frozen: dict[str, Tensor] = {}
        for s in specs:
            frozen[THETA + s.name] = theta[s.name]
            frozen[COST + s.name] = l0 * group_sizes(s, w).float()
            frozen[ALIVE + s.name] = alive[s.name].float()
        if cfg.lam:
            frozen.update({ANCHOR + k: t for k, t in w.items()})
        pruned = not all(bool(a.all()) for a in alive.values())
        return (specs, alive, w, v, theta, frozen, pruned)

    def client_job(
        down: Mapping[str, Tensor], cstate: Any, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        specs, alive, w, v, theta, frozen, pruned = received(down, ctx)
        rows = ctx.local.batch_size * math.prod(data.y.shape[1:])  # rows a batch feeds a layer
        program = program_for(ctx.model, pruned, rows)
        gen = ctx.generator

        batches = _local.batch_schedule(data.num_examples, ctx.local, gen)
        noise = iter(step_noise(specs, len(batches), gen, w) if not cfg.force_gates_on else [])

        def draws() -> dict[str, Tensor]:  # the hard-concrete noise u of each group, in order
            return next(noise, {})

        def finish(res: _jobs.JobResult) -> ClientResult:
            w_s = {k: res.live[k] for k in w}
            pis = {
                s.name: torch.sigmoid(
                    gate_logits(res.live, {s.name: res.live[GATE + s.name]}, s, cfg.T)
                ).detach()
                for s in specs
            }
            z = {s.name: _sample_z(pis[s.name], gen, cfg) & alive[s.name] for s in specs}
            sent = entry_masks(specs, z, w_s)
            uploaded = {k: t * sent[k] if k in sent else t for k, t in w_s.items()}  # z_s ⊙ w_s
            tv = torch.cat([(pis[s.name] - theta[s.name]).abs()[alive[s.name]] for s in specs])
            n_alive = sum(int(a.sum()) for a in alive.values())
            return ClientResult(
                uplink=Payload(encode_groups(w_s, specs, z, send_masks=True, mask_over=alive)),
                state=None,
                local_params=uploaded,
                num_examples=data.num_examples,
                metrics={
                    "train/loss": res.loss,
                    "fedsparse/tv_mean": float(tv.mean()) if tv.numel() else 0.0,
                    "fedsparse/tv_max": float(tv.max()) if tv.numel() else 0.0,
                    "fedsparse/upload_fraction": sum(int(m.sum()) for m in z.values())
                    / max(1, n_alive),
                },
            )

        start = {**w, **{GATE + s.name: v[s.name] for s in specs}}
        return _jobs.new_job(
            program, start, data, ctx.local, batches, finish, frozen=dict(frozen), draws=draws
        )

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        weights = torch.tensor(
            client_weights(uplinks, cfg.weighting), device=next(iter(state.params.values())).device
        )
        weights = weights / weights.sum()
        theta = thetas(state.params, state.v, state.specs)
        zs = [
            {
                s.name: scatter_mask(u.tensors[f"mask/{s.name}"], state.alive[s.name])
                for s in state.specs
            }
            for u in uplinks
        ]
        g_w = weight_gradient(state.params, [u.tensors for u in uplinks], zs, weights, state.specs)
        step, w_opt_state = w_opt.update(g_w, state.w_opt)
        params = apply_step(state.params, step)
        g_v = {
            s.name: v_gradient(
                [z[s.name] for z in zs], theta[s.name], state.v[s.name], cfg.T, weights
            )
            * state.alive[s.name]
            for s in state.specs
        }
        v_step, v_opt_state = v_opt.update(g_v, state.v_opt)
        v = {k: state.v[k] + v_step[k] * state.alive[k] for k in state.v}
        alive = dict(state.alive)
        if cfg.server_prune and not cfg.force_gates_on:
            new_theta = thetas(params, v, state.specs)
            alive = {k: a & (new_theta[k] > cfg.prune_threshold) for k, a in alive.items()}
        keep = entry_masks(state.specs, alive, params)
        params = {k: t * keep[k] if k in keep else t for k, t in params.items()}
        w_opt_state = _mask_moments(w_opt_state, keep)
        return ServerState(params, v, alive, w_opt_state, v_opt_state, state.specs)

    def server_metrics(state: ServerState) -> dict[str, float]:
        alive = torch.cat([a.float() for a in state.alive.values()])
        theta = torch.cat(list(thetas(state.params, state.v, state.specs).values()))
        return {
            "fedsparse/groups_alive": float(alive.mean()),
            "fedsparse/theta_mean": float(theta.mean()),
        }

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
        server_metrics=server_metrics,
    )


def step_noise(
    specs: Sequence[GroupSpec], steps: int, generator: torch.Generator, like: Params
) -> list[dict[str, Tensor]]:
    """The hard-concrete noise ``u ~ U(1e-6, 1 − 1e-6)`` of every group for each of ``steps``
    local steps (step by step, group by group: the order the local loop uses it), drawn in one
    call: torch's CPU uniform fills element by element from the generator, so one draw of
    ``steps × Σ count`` equals the per-step draws (tested). Drawn on the (CPU) generator, then
    moved to the parameters' device: the same noise on every device."""
    counts = [s.count for s in specs]
    if not steps or not counts:
        return [{} for _ in range(steps)]
    device = next(iter(like.values())).device
    u = torch.rand(steps * sum(counts), generator=generator, device=generator.device)
    rows = u.clamp_(1e-6, 1 - 1e-6).to(device).view(steps, -1)
    return [
        {NOISE + s.name: part for s, part in zip(specs, row.split(counts), strict=True)}
        for row in rows
    ]


def weight_gradient(
    params: Params,
    uploads: Sequence[Mapping[str, Tensor]],
    zs: Sequence[Mapping[str, Tensor]],
    weights: Tensor,
    specs: Sequence[GroupSpec],
) -> Params:
    """The server's ``Σ_s p_s z_s ⊙ (ŵ_s − w)`` (ungated parameters: ``z_s ≡ 1``), each upload
    added straight into its kept slices (``index_add_`` of ``p_s (ŵ_s − w)`` there; nothing
    elsewhere, where ``z_s = 0``): no full-size decode, mask or product per client. Differences
    are taken before the sum, as Algorithm 1 writes it per client, ``p_s z_s ⊙ (ŵ_s − w)`` over
    full-size decoded uploads (a server Adam step is sensitive to the rounding of tiny means),
    and agree with that form to the bit (tested)."""
    axes = member_axes(specs)
    p = [float(wt) for wt in weights]  # (one read of the K weights)
    out: Params = {k: torch.zeros_like(t) for k, t in params.items()}
    for up, z, ps in zip(uploads, zs, p, strict=True):
        for k, w in params.items():
            values = up[f"w/{k}"]
            # (product, then sum: a fused multiply-add would round differently)
            if k not in axes or bool(z[axes[k][0].name].all()):
                out[k].add_((values.reshape(w.shape) - w).mul_(ps))
                continue
            spec, axis = axes[k]
            idx = z[spec.name].nonzero().flatten()  # the kept groups, ascending
            sel = list(w.shape)
            sel[axis] = idx.numel()
            diff = values.reshape(sel) - w.index_select(axis, idx)
            out[k].index_add_(axis, idx, diff.mul_(ps))
    return out


def layer_of(spec: GroupSpec) -> str:
    """The module owning a spec's (first) member parameter: ``"fc1.weight"`` -> ``"fc1"``."""
    return spec.members[0][0].rpartition(".")[0]


def input_gated(model: torch.nn.Module, spec: GroupSpec, rows: int) -> bool:
    """Whether ``spec``'s gates can multiply its layer's input instead of its weight, and that is
    cheaper: a linear layer gated on its input features (``W ⊙ z`` along the columns, no bias
    member: ``(x ⊙ z) Wᵀ + b = x (W ⊙ z)ᵀ + b``) fed fewer ``rows`` per batch than it has
    outputs (the input is then smaller than the weight, forward and backward)."""
    if spec.kind != "in_feature" or len(spec.members) != 1 or spec.members[0][1] != 1:
        return False
    module = model.get_submodule(layer_of(spec))
    return isinstance(module, torch.nn.Linear) and rows < module.out_features


def _sample_z(pi: Tensor, generator: torch.Generator, cfg: Config) -> Tensor:
    """Exact binary upload gates ``z ~ Bern(π)`` (all ones when gates are forced on)."""
    if cfg.force_gates_on:
        return torch.ones(pi.shape, dtype=torch.bool, device=pi.device)
    # drawn on the (CPU) generator, so the gates, and the bits they cost, are device-independent
    return torch.bernoulli(pi.to(generator.device), generator=generator).bool().to(pi.device)


def _mask_moments(state: Any, keep: Mapping[str, Tensor]) -> Any:
    """Zero optimizer moments of pruned entries (spec §1.4 Rec) in any nested opt state."""
    if isinstance(state, dict):
        return {
            k: t * keep[k] if k in keep and isinstance(t, Tensor) else _mask_moments(t, keep)
            for k, t in state.items()
        }
    if isinstance(state, tuple):
        return tuple(_mask_moments(s, keep) for s in state)
    return state


@register(Config)
def build(cfg: Config) -> FedAlgorithm:
    return make(cfg)
