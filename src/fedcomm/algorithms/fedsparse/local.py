"""FedSparse's local step (Algorithm 2's inner loop) as a :class:`~fedcomm.algorithms.core.jobs.
LocalProgram`: the forward pass on ``w_s ⊙ z`` with hard-concrete gates ``z``, the client
objective's penalties, SGD on ``w_s`` and Adamax on ``v_s``, pruned groups held at zero.

A program is built once per model structure (and whether some group is pruned, and which layers
are gated at their input); every client-specific tensor (θ, λ0|g|, alive masks, ``w`` for the
drift, the gate noise ``u``) is read from the step's ``full`` dict under the keys below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Literal

import torch
from torch import Tensor

from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.grouped import member_axes
from fedcomm.algorithms.fedsparse.gates import gate_logits, hard_concrete
from fedcomm.algorithms.fedsparse.penalties import drift, l0_cost, prior_log_likelihood
from fedcomm.models.groups import GroupSpec, group_sizes, groups
from fedcomm.types import ParamDict

# per-client tensors of the local step (LocalJob.frozen / live keys)
GATE, NOISE, THETA, COST, ALIVE, ANCHOR = "gate.", "u.", "theta.", "l0.", "alive.", "anchor."
LOGIT = "logit."  # logit π of a group, computed once a step by the forward pass
INPUT_GATE = "in_gate."  # z of a group gated at its layer's input (forward pass only)
SCALE = "penalty_scale"  # () 1/N_s: the penalties' weight under ``data_term: shard_sum``


@dataclass(frozen=True)
class StepRule:
    """What the local step reads from the config."""

    T: float  # gate temperature
    shift: float  # log α = logit π − shift (0, or the L0 paper's 1.599: Eq. 41)
    force_on: bool  # z ≡ 1 (ablation)
    ce_scale: float  # c_CE
    lam: float  # drift λ
    gate_lr: float  # Adamax lr on v_s
    gate_at: Literal["auto", "weights"]  # where a linear layer's input-feature gates apply
    prune_output: bool  # whether the output layer's inputs are gated
    gate_optimizer: Literal["adamax", "sgd"] = "adamax"  # client rule on v_s (sgd: a diagnosis)


def gated_groups(model: torch.nn.Module | None, prune_output: bool) -> tuple[GroupSpec, ...]:
    """The groups that carry gates: every group, less the output layer's unless gated."""
    if model is None:
        raise ValueError("fedsparse needs the model structure in the round context")
    return tuple(s for s in groups(model) if prune_output or not s.is_output)


def step_constants(
    theta: ParamDict,
    alive: ParamDict,
    w: ParamDict,
    specs: Sequence[GroupSpec],
    l0: float,
    anchored: bool,
) -> dict[str, Tensor]:
    """A round's per-client constants of the step: θ, ``λ0 |g|``, the alive masks and (for the
    drift, ``anchored``) the server's ``w``."""
    frozen: dict[str, Tensor] = {}
    for s in specs:
        frozen[THETA + s.name] = theta[s.name]
        frozen[COST + s.name] = l0 * group_sizes(s, w).float()  # λ0 |g|
        frozen[ALIVE + s.name] = alive[s.name].float()
    if anchored:
        frozen.update({ANCHOR + k: t for k, t in w.items()})
    return frozen


def penalty_scale(num_examples: int, like: Tensor) -> dict[str, Tensor]:
    """The per-client frozen entry of ``data_term: shard_sum``: ``1/N_s``, the weight of the
    penalties beside the minibatch mean CE once Eq. 17's shard sum ``N_s · mean`` is divided by
    ``N_s`` (a 0-d tensor, stacked per client by the vectorized backend)."""
    return {SCALE: torch.tensor(1.0 / max(1, num_examples), dtype=like.dtype, device=like.device)}


def step_noise(
    specs: Sequence[GroupSpec], steps: int, generator: torch.Generator, like: ParamDict
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


def _along(t: Tensor, axis: int, count: int) -> list[int]:
    """The shape broadcasting a ``(count,)`` group vector along ``axis`` of ``t``."""
    shape = [1] * t.dim()
    shape[axis] = count
    return shape


def gated_params(
    full: dict[str, Tensor], *, specs: Sequence[GroupSpec], rule: StepRule, at_input: frozenset[str]
) -> dict[str, Tensor]:
    """The forward pass's parameters ``w_s ⊙ z``, ``z`` hard-concrete with ``log α = logit π``
    (Algorithm 2 lines 6-7; Appendix H, Eq. 41); groups in ``at_input`` leave ``z`` for their
    layer's input instead."""
    out = dict(full)
    for s in specs:
        if rule.force_on:
            break
        logits = gate_logits(full, {s.name: full[GATE + s.name]}, s, rule.T)
        out[LOGIT + s.name] = logits  # logit π, for the penalties of the same step
        z = hard_concrete(logits - rule.shift, full[NOISE + s.name]) * full[ALIVE + s.name]
        if s.name in at_input:  # x ⊙ z into the layer: the same as W ⊙ z, cheaper
            out[INPUT_GATE + s.name] = z
            continue
        for name, axis in s.members:
            out[name] = out[name] * z.reshape(_along(full[name], axis, s.count))
    return out


def _pi(full: Mapping[str, Tensor], spec: GroupSpec, T: float) -> Tensor:  # π_g
    logits = full.get(LOGIT + spec.name)  # computed by gated_params this step
    if logits is None:
        logits = gate_logits(full, {spec.name: full[GATE + spec.name]}, spec, T)
    return torch.sigmoid(logits)


def objective(
    full: Mapping[str, Tensor], loss: Tensor, *, specs: Sequence[GroupSpec], rule: StepRule
) -> Tensor:
    """``L_s``: the data loss plus the L0, prior cross-entropy and drift terms (Eq. 17 / 39;
    Algorithm 2 line 8); under ``data_term: shard_sum`` the penalties are weighted by the
    client's ``1/N_s`` (``full[SCALE]``)."""
    scale = full.get(SCALE)

    def weigh(term: Tensor) -> Tensor:  # the default's sums stay as they were, term by term
        return term if scale is None else scale * term

    total = loss
    for s in specs:
        pi, th = _pi(full, s, rule.T), full[THETA + s.name].clamp(1e-6, 1 - 1e-6)
        total = total + weigh(l0_cost(full[COST + s.name], pi))  # λ0 |g| π_g
        total = total - weigh(rule.ce_scale * prior_log_likelihood(pi, th))
        if rule.lam:
            anchor = {n: full[ANCHOR + n] for n, _ in s.members}
            total = total + weigh(0.5 * rule.lam * drift(full, anchor, s, pi))
    return total


def keep_pruned(
    live: dict[str, Tensor],
    frozen: Mapping[str, Tensor],
    before: Mapping[str, Tensor],
    *,
    axes: Mapping[str, tuple[GroupSpec, int]],
) -> dict[str, Tensor]:
    """Pruned groups stay 0: ``w ⊙ alive``, broadcast along each member's group axis."""
    out = dict(live)
    for name, (spec, axis) in axes.items():
        alive = frozen[ALIVE + spec.name].reshape(_along(live[name], axis, spec.count))
        out[name] = live[name] * alive
    return out


def local_program(
    specs: Sequence[GroupSpec], rule: StepRule, pruned: bool, at_input: frozenset[str]
) -> _jobs.LocalProgram:
    """The step rule: SGD on ``w_s``, Adamax on ``v_s`` (Algorithm 2 lines 9-10) of
    :func:`objective` on :func:`gated_params`. ``pruned``: some group is pruned, so a post-step
    keeps its weights at 0 (with every group alive that projection is the identity, and leaving
    it out saves a full-size pass per step)."""
    return _jobs.LocalProgram(
        loss_hook=partial(objective, specs=specs, rule=rule),
        post_step=partial(keep_pruned, axes=member_axes(specs)) if pruned else None,
        param_map=partial(gated_params, specs=specs, rule=rule, at_input=at_input),
        aux=_local.AuxAdamax(
            frozenset(GATE + s.name for s in specs), lr=rule.gate_lr, rule=rule.gate_optimizer
        ),
        input_gates=tuple((layer_of(s), INPUT_GATE + s.name) for s in specs if s.name in at_input),
    )


class Programs:
    """Each model's gated groups, parameter shapes and local programs, built once (not per
    client): clients training together must share one program object."""

    def __init__(self, rule: StepRule) -> None:
        self.rule = rule
        self._programs: dict[
            tuple[int, bool, frozenset[str]], tuple[torch.nn.Module, _jobs.LocalProgram]
        ] = {}
        self._structures: dict[int, tuple[torch.nn.Module, tuple[GroupSpec, ...], ParamDict]] = {}

    def structure(self, model: torch.nn.Module) -> tuple[tuple[GroupSpec, ...], ParamDict]:
        """The model's gated groups and parameters (for their shapes)."""
        hit = self._structures.get(id(model))
        if hit is None or hit[0] is not model:
            shapes = {k: p.detach() for k, p in model.named_parameters()}
            hit = (model, gated_groups(model, self.rule.prune_output), shapes)
            self._structures[id(model)] = hit
        return hit[1], hit[2]

    def get(self, model: torch.nn.Module, pruned: bool, rows: int) -> _jobs.LocalProgram:
        """The program for this model; ``rows``: rows a batch feeds each layer, so a linear
        layer's input-feature gates are applied to its input where that is smaller than its
        weight (:func:`input_gated`)."""
        specs, _ = self.structure(model)
        auto = self.rule.gate_at == "auto"
        at_input = frozenset(s.name for s in specs if auto and input_gated(model, s, rows))
        key = (id(model), pruned, at_input)
        hit = self._programs.get(key)
        if hit is None or hit[0] is not model:
            hit = (model, local_program(specs, self.rule, pruned, at_input))
            self._programs[key] = hit
        return hit[1]
