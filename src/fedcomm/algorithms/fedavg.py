"""FedAvg with a composable server optimizer (FedAvgM, FedAdam are presets of ``server``).

McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017 (arXiv:1602.05629); server optimizers as in Reddi et al., "Adaptive Federated
Optimization", ICLR 2021 (arXiv:2003.00295).

Round ``t``: the server sends ``w_t`` densely; client ``k`` runs local SGD from ``w_t`` and
uploads ``Δ_k = w_k − w_t`` densely; the server forms ``Δ = Σ_k n_k Δ_k / Σ_k n_k`` (or the
uniform mean; ``average: senders``: each entry over the clients whose sparse upload carries it)
and applies ``w_{t+1} = w_t + server_opt(Δ)``. With ``server.optimizer=sgd`` and
``lr=1`` this is plain model averaging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field
from torch import Tensor

from fedcomm.algorithms.core import (
    AlgorithmConfig,
    FedAlgorithm,
    client_weights,
    clone_params,
    job_algorithm,
    register,
    sender_mean,
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
from fedcomm.algorithms.core.reuse import Reused
from fedcomm.comm.codecs import encode_dense
from fedcomm.comm.payload import Payload
from fedcomm.server_opt import OptState, Transform
from fedcomm.types import ParamDict


class Config(AlgorithmConfig):
    name: Literal["fedavg"] = "fedavg"
    weighting: Literal["num_examples", "uniform"] = "num_examples"
    average: Literal["all", "senders"] = Field(
        "all",
        description="all (default): Δ = Σ_k n_k Δ_k / Σ_k n_k over every client; senders: each "
        "entry over the clients whose decoded upload is non-zero there (a sparse uplink's "
        "positions, e.g. DGC's top-k), not diluted by the clients that did not send it",
    )


@dataclass(frozen=True)
class ServerState:
    params: ParamDict
    opt_state: OptState


ANCHOR = "anchor."  # frozen copies of w_t under these keys, for an anchored grad_hook


def anchors(down: Mapping[str, Tensor]) -> ParamDict:
    """``w_t`` under the :data:`ANCHOR` keys: a job's ``frozen`` tensors for a local term
    centred on the downloaded model."""
    return {ANCHOR + k: v for k, v in down.items()}


def add_delta(down: Mapping[str, Tensor], up: Mapping[str, Tensor]) -> ParamDict:
    """``w_t + Δ``: the model a dense delta upload stands for (``uploaded_model``)."""
    return {k: down[k] + up[k] for k in down}


def make(
    cfg: AlgorithmConfig,
    weighting: str,
    anchored_hook: _local.GradHook | None = None,
    average: str = "all",
) -> FedAlgorithm[ServerState]:
    """FedAvg's functions; ``anchored_hook(full, grads)`` adds a local gradient term that reads
    ``w_t`` as ``full[ANCHOR + name]`` (FedProx)."""
    opt: Transform = cfg.server.build()
    program = _jobs.LocalProgram(grad_hook=anchored_hook)

    def init_server(params: ParamDict, ctx: RoundContext) -> ServerState:
        return ServerState(clone_params(params), opt.init(params))

    sent: Reused[Payload] = Reused()  # the current server state's downlink, encoded once

    def broadcast(state: ServerState, client_id: int, cstate: None, ctx: RoundContext) -> Payload:
        return sent.get([state], lambda: encode_dense(state.params))

    def client_job(
        down: Mapping[str, Tensor], cstate: None, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        def finish(res: _jobs.JobResult) -> ClientResult:
            return ClientResult(
                uplink=encode_dense(subtract(res.live, down)),
                state=None,
                local_params=res.live,
                num_examples=data.num_examples,
                metrics={"train/loss": res.loss},
            )

        frozen = anchors(down) if anchored_hook is not None else {}
        batches = _local.batch_schedule(data.num_examples, ctx.local, ctx.generator)
        return _jobs.new_job(program, down, data, ctx.local, batches, finish, frozen=frozen)

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        mean = sender_mean if average == "senders" else weighted_mean
        delta = mean([u.tensors for u in uplinks], client_weights(uplinks, weighting))
        return ServerState(*opt.apply(state.params, delta, state.opt_state))

    return job_algorithm(
        cfg,
        init_server=init_server,
        broadcast=broadcast,
        client_job=client_job,
        server_update=server_update,
        uploaded_model=add_delta,
        delta_uplink=True,  # Δ_k from w_t, averaged: FedBuff / FedAsync may take it stale
    )


@register(Config)
def build(cfg: Config) -> FedAlgorithm[ServerState]:
    return make(cfg, cfg.weighting, average=cfg.average)
