"""FedDrop: each client trains a random sub-model with whole units dropped.

Caldas, Konečný, McMahan and Talwalkar, "Expanding the Reach of Federated Learning by Reducing
Client Resource Requirements", arXiv:1812.07210, 2018; as the baseline of Louizos et al., "An
Expectation-Maximization Perspective on Federated Learning", Appendix A.

Round ``t``, client ``k`` (selection from ``(seed, ALGORITHM, t, k)``, replayed by both sides:
0 bits): drop exactly ``round(p·n)`` of the ``n`` units of every layer of ``rows(model)``, with
``p = conv_rate`` for conv filters and ``fc_rate`` for hidden linear units (the output layer only
with ``drop_output``; its dropped logits are then fixed at 0, not removed). A dropped unit takes
its weight row and bias and the next layer's input columns reading it (after a flatten, the
``in_features / channels`` consecutive columns of its channel).

* down: the sub-model's values, 32 bits each; up: the delta of masked local SGD on the same
  entries (dropped entries stay 0 and their gradients are masked: the smaller dense network);
* ``rescale`` (training only; on by default): inverted dropout, each hidden layer's kept units'
  outputs scaled by ``n / kept`` (``1 / (1 − p)`` up to rounding) in the forward pass of local
  training (:func:`.submodel.hidden_scaler`), so the sub-model's activations have the full
  model's expected scale; evaluation runs the unscaled full model. Caldas et al. say nothing of
  it; the default is the reading that reproduces Louizos et al.'s Table 1 (FedDrop 69.9 against
  FedAvg's 69.7): with it FedDrop ends −0.4 points from FedAvg on CIFAR-10, without it −3.7
  (three seeds; docs/reproductions/fedsparse.md). Off: the smaller dense network as it is;
* server: per entry ``Δ = Σ_k n_k δ_k / Σ_{k holds it} n_k`` (``aggregate="all"``: divided by
  every client's weight), then ``w ← w + server_opt(Δ)`` (Adam, lr 1e-3) where some client held
  the entry; entries nobody held stay untouched.

Sequential Linear/Conv chains only (``mlp``, ``cnn``, ``mnist_cnn``). The unit graph, codec,
client side and aggregation are the sub-model family's (:mod:`.submodel`), re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from fedcomm.algorithms import submodel
from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm, RoundContext, register
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.submodel.codec import uploaded_model
from fedcomm.algorithms.submodel.merge import masked_mean
from fedcomm.algorithms.submodel.units import drop_counts, select, unit_layers
from fedcomm.models.groups import GroupSpec
from fedcomm.seeding import Stream, torch_generator
from fedcomm.server_opt import ServerOptConfig, adam_server
from fedcomm.types import ParamDict


class Config(AlgorithmConfig):
    name: Literal["feddrop"] = "feddrop"
    server: ServerOptConfig = Field(default_factory=adam_server)
    conv_rate: float = Field(0.1, ge=0, lt=1, description="fraction of conv filters dropped")
    fc_rate: float = Field(0.5, ge=0, lt=1, description="fraction of hidden FC units dropped")
    drop_output: bool = False
    aggregate: Literal["held", "all"] = "held"
    weighting: Literal["uniform", "num_examples"] = "uniform"  # the paper: plain mean
    rescale: bool = Field(
        True, description="inverted dropout: scale kept hidden units by n / kept in training"
    )


def select_units(
    layers: Sequence[GroupSpec], counts: Mapping[str, int], seed: int, round_: int, client_id: int
) -> dict[str, Tensor]:
    """Keep masks ``(count,)`` per layer from ``(seed, ALGORITHM, round_, client_id)``: the
    ``counts[layer]`` units first in a uniformly random permutation are dropped (the ranking is
    the permutation reversed), layer by layer."""
    g = torch_generator(seed, Stream.ALGORITHM, round_, client_id)

    def random_rank(spec: GroupSpec, n_keep: int) -> Tensor:
        return torch.randperm(spec.count, generator=g, device=g.device).flip(0)

    return select(layers, {s.name: s.count - counts[s.name] for s in layers}, random_rank)


def keep_shares(cfg: Config, layers: Sequence[GroupSpec]) -> dict[str, float]:
    """Each layer's kept share of units, ``kept / n`` (the same for every client and round)."""
    counts = drop_counts(layers, cfg.conv_rate, cfg.fc_rate, cfg.drop_output)
    return {s.name: (s.count - counts[s.name]) / s.count for s in layers}


@register(Config)
def build(cfg: Config) -> FedAlgorithm[submodel.ServerState]:
    # per model structure: its inverted-dropout scaler (``rescale``) and local program
    built: dict[int, tuple[nn.Module, _local.ParamMap, _jobs.LocalProgram]] = {}

    def for_model(model: nn.Module) -> tuple[_local.ParamMap, _jobs.LocalProgram]:
        hit = built.get(id(model))
        if hit is None or hit[0] is not model:
            layers = unit_layers(model, cfg.name)
            scale = submodel.hidden_scaler(layers, keep_shares(cfg, layers))
            program = _jobs.LocalProgram(grad_hook=submodel.masked_grads, param_map=scale)
            hit = built[id(model)] = (model, scale, program)
        return hit[1], hit[2]

    def keep(state: submodel.ServerState, client_id: int, ctx: RoundContext) -> dict[str, Tensor]:
        counts = drop_counts(state.layers, cfg.conv_rate, cfg.fc_rate, cfg.drop_output)
        return select_units(state.layers, counts, ctx.seed, ctx.round_, client_id)

    def uploaded_scaled(down: Mapping[str, Tensor], up: Mapping[str, Tensor]) -> ParamDict:
        """The uploaded sub-model as the function it trained as (one model a run)."""
        (_, scale, _), *_ = built.values()
        return scale(dict(uploaded_model(down, up)))

    if not cfg.rescale:
        return submodel.algorithm(
            cfg, submodel.Selection(keep), masked_mean(cfg.aggregate), weighting=cfg.weighting
        )
    return submodel.algorithm(
        cfg,
        submodel.Selection(keep),
        masked_mean(cfg.aggregate),
        weighting=cfg.weighting,
        client_job=submodel.masked_client(
            cfg.name,
            program=lambda m: for_model(m)[1],
            local_map=lambda m: for_model(m)[0],
        ),
        uploaded_model=uploaded_scaled,
    )
