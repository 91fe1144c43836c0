"""FedL1: FedAvg with a local group-L1 penalty and hard-thresholded messages.

Louizos et al., "An Expectation-Maximization Perspective on Federated Learning", Appendix A,
Eqs. 24-25; group L1 after Wen et al., "Learning Structured Sparsity in Deep Neural
Networks", NeurIPS 2016. Groups are FedSparse's (:func:`fedcomm.models.groups.groups`): conv
output filters and linear input features (the output layer's too, unless ``prune_output`` is
off); other parameters (FC biases) are always sent.

* local loss: ``mean CE + λ Σ_g ‖w_g‖₂``;
* before every message, both ways: ``ŵ_g = w_g · 1[‖w_g‖₂ > λ]`` (hard threshold; the paper found
  soft thresholding worse), sent as the kept groups' values (32 bits each), one bit per group and
  the ungrouped parameters densely;
* server: ``w ← w + server_opt(mean_s(ŵ_s − w))`` (Adam, lr 1e-3) on its unthresholded ``w``; the
  broadcast and the evaluated global model are the pruned ``ŵ``. ``λ = 0`` is FedAvg.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

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
from fedcomm.algorithms.core.grouped import decode_groups, encode_groups
from fedcomm.comm.payload import Payload
from fedcomm.models.groups import GroupSpec, apply_mask, group_norms, groups
from fedcomm.server_opt import OptState, ServerOptConfig, adam_server
from fedcomm.types import ParamDict


class Config(AlgorithmConfig):
    name: Literal["fedl1"] = "fedl1"
    server: ServerOptConfig = Field(default_factory=adam_server)
    threshold: float = Field(2e-3, ge=0, description="λ: group-L1 coefficient and hard threshold")
    prune_output: bool = True
    weighting: Literal["uniform", "num_examples"] = "uniform"  # the paper: mean(ŵ_s − w)


def group_specs(model: nn.Module | None, prune_output: bool) -> tuple[GroupSpec, ...]:
    """FedSparse's groups of ``model``, without the output layer's unless ``prune_output``."""
    if model is None:
        raise ValueError("fedl1 needs the model structure in the round context")
    return tuple(s for s in groups(model) if prune_output or not s.is_output)


def group_l1(specs: Sequence[GroupSpec], lam: float) -> _local.LossHook:
    """``loss ↦ loss + λ Σ_g ‖w_g‖₂`` (gradient ``λ w_g / ‖w_g‖`` off zero groups)."""

    def hook(params: Mapping[str, Tensor], loss: Tensor) -> Tensor:
        return loss + lam * sum(group_norms(params, s).sum() for s in specs)

    return hook


def hard_threshold(
    params: Mapping[str, Tensor], specs: Sequence[GroupSpec], lam: float
) -> tuple[ParamDict, dict[str, Tensor]]:
    """``(ŵ, keep)``: groups with ``‖w_g‖₂ <= λ`` zeroed; ``keep`` is ``(count,)`` bool per spec."""
    keep = {s.name: group_norms(params, s) > lam for s in specs}
    return apply_mask(params, specs, keep), keep


def encode(
    params: Mapping[str, Tensor], keep: Mapping[str, Tensor], specs: Sequence[GroupSpec]
) -> Payload:
    """Kept groups' values (32 bits each), one bit per group, ungrouped parameters densely."""
    return Payload(encode_groups(params, specs, keep, send_masks=True))


def decode(
    decoded: Mapping[str, Tensor], shapes: Mapping[str, Tensor], specs: Sequence[GroupSpec]
) -> ParamDict:
    """Inverse of :func:`encode` (``shapes``: the receiver's own parameters)."""
    return decode_groups(decoded, shapes, specs, {s.name: decoded[f"mask/{s.name}"] for s in specs})


@dataclass(frozen=True)
class ServerState:
    params: ParamDict  # unthresholded; messages and the global model are thresholded
    opt_state: OptState
    specs: tuple[GroupSpec, ...]


@register(Config)
def build(cfg: Config) -> FedAlgorithm[ServerState]:
    opt = cfg.server.build()
    lam = cfg.threshold

    def init_server(params: ParamDict, ctx: RoundContext) -> ServerState:
        specs = group_specs(ctx.model, cfg.prune_output)
        return ServerState(clone_params(params), opt.init(params), specs)

    def broadcast(state: ServerState, client_id: int, cstate: None, ctx: RoundContext) -> Payload:
        return encode(*hard_threshold(state.params, state.specs, lam), state.specs)

    programs: dict[int, tuple[torch.nn.Module, _jobs.LocalProgram]] = {}

    def program_for(model: torch.nn.Module) -> _jobs.LocalProgram:
        hit = programs.get(id(model))
        if hit is None or hit[0] is not model:
            specs = group_specs(model, cfg.prune_output)
            hook = group_l1(specs, lam) if lam > 0 else None
            hit = (model, _jobs.LocalProgram(loss_hook=hook))
            programs[id(model)] = hit
        return hit[1]

    def client_job(
        down: Mapping[str, Tensor], cstate: None, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        specs = group_specs(ctx.model, cfg.prune_output)
        shapes = {k: p.detach() for k, p in ctx.model.named_parameters()}
        start = decode(down, shapes, specs)

        def finish(res: _jobs.JobResult) -> ClientResult:
            sparse, keep = hard_threshold(res.live, specs, lam)
            kept = (
                torch.cat(list(keep.values())).float().mean()
                if keep
                else torch.ones((), device="cpu")
            )
            return ClientResult(
                uplink=encode(sparse, keep, specs),
                state=None,
                local_params=sparse,
                num_examples=data.num_examples,
                metrics={"train/loss": res.loss, "fedl1/kept_groups": float(kept)},
            )

        batches = _local.batch_schedule(data.num_examples, ctx.local, ctx.generator)
        return _jobs.new_job(program_for(ctx.model), start, data, ctx.local, batches, finish)

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        ups = [decode(u.tensors, state.params, state.specs) for u in uplinks]
        deltas = [subtract(up, state.params) for up in ups]
        delta = weighted_mean(deltas, client_weights(uplinks, cfg.weighting))
        return ServerState(*opt.apply(state.params, delta, state.opt_state), state.specs)

    return job_algorithm(
        cfg,
        init_server=init_server,
        broadcast=broadcast,
        client_job=client_job,
        server_update=server_update,
        global_params=lambda s: hard_threshold(s.params, s.specs, lam)[0],
    )
