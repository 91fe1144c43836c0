"""The algorithm contract: what every algorithm is, and the pieces every algorithm composes.

An algorithm is a frozen value of pure functions over explicit state (FedJAX's container,
optax's state discipline), built from its pydantic config by a registered builder:

* ``init_server(params, ctx) -> server_state`` from the initial model parameters;
* ``init_client(client_id) -> client_state`` for a client's first participation;
* ``broadcast(server_state, client_id, client_state, ctx) -> Payload`` the downlink message;
* ``client_update(downlink, client_state, data, ctx) -> ClientResult`` local work on the
  *decoded* downlink; returns the uplink payload, the new client state and the model the client
  ends the round with (its "last upload" for local accuracy);
* ``server_update(server_state, uplinks, ctx) -> server_state`` from the decoded uplinks;
* ``global_params(server_state) -> ParamDict`` the model evaluated globally and saved (an
  ensemble returns its members joined by :func:`join_members`; evaluation then averages the
  members' softmax outputs and logs each member's accuracy);
* ``uploaded_model(downlink, uplink) -> ParamDict`` (optional) the model a decoded upload stands
  for, so that local accuracy measures what was actually sent when a compressor is lossy;
* ``warm_start(server_state, train, ctx) -> (server_state, messages)`` (optional) work on
  clients' data before round 1 (GraSP pruning at initialisation, PruneFL's phase one); the
  messages it returns (``client_id, direction, payload``) are charged to the ledger as round 0;
* ``prepare_model(model, seed) -> model`` (optional) the structure the algorithm trains and
  evaluates, built around the registry's model (ProgFed's progressive net with its temporary
  heads); the loop and the evaluate stage call it, and it must be deterministic in ``seed``.
* ``execution`` (optional) how the simulator may run and charge it, not what it computes: an
  :class:`Execution` record of hints for the backends and the clock (the local training as a
  batched job, why there is none, sparse compute).

An algorithm whose config's :meth:`AlgorithmConfig.extra_rounds` is positive runs that many
rounds on top of ``train.rounds`` (ProgFed's warm-up rounds, which do not count toward T).

The round loop (:mod:`fedcomm.simulation.loop`) owns sampling, encoding, accounting and
evaluation; algorithms never see the ledger. Adding an algorithm = one module with a ``Config``
(``name: Literal[...]``) and a ``@register(Config)`` builder (:mod:`.registry`); the contract
tests pick it up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor, nn

from fedcomm.algorithms.core.context import (
    ClientContext,
    ClientData,
    ClientResult,
    ClientState,
    Message,
    RoundContext,
    Uplink,
    WarmStartContext,
)
from fedcomm.algorithms.core.jobs import ClientJob
from fedcomm.algorithms.core.sequential import job_client_update
from fedcomm.comm.compressors.config import CompressorConfig
from fedcomm.comm.payload import Payload
from fedcomm.server_opt import ServerOptConfig
from fedcomm.types import ParamDict

S = TypeVar("S")  # one algorithm's server state (``fedavg.ServerState``, ...)


class AlgorithmConfig(BaseModel):
    """Base of every algorithm's config; subclasses add ``name: Literal["..."]`` and fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    server: ServerOptConfig = Field(default_factory=ServerOptConfig)
    # this run's uplink compressor (e.g. FedBIAD+DGC); null = train.compressor
    uplink: CompressorConfig | None = None

    def with_rounds(self, rounds: int) -> AlgorithmConfig:
        """This config with defaults that depend on ``train.rounds`` filled in (e.g. FedDST's
        ``readjust_end = R // 2``); :meth:`fedcomm.config.Params.algorithm` calls it."""
        return self

    def extra_rounds(self) -> int:
        """Rounds this algorithm runs on top of ``train.rounds`` (ProgFed's warm-up rounds)."""
        return 0


@dataclass(frozen=True)
class Execution:
    """How the simulator may run an algorithm and what its clients' compute costs: hints for the
    backends and the clock, not the algorithm (``client_update`` alone defines the client step).
    ``client_job`` and ``unbatched`` change no number a run reports (both backends give the same
    run); ``sparse_compute`` is the clock's cost model, so under a ``train.system`` section it
    sets each client's simulated compute time, and with it who makes the deadline.

    * ``client_job(downlink, client_state, data, ctx) -> LocalJob``: the local training as data
      (:mod:`fedcomm.algorithms.core.jobs`), so the vectorized backend can train a round's
      clients as one batched computation; ``client_update`` is then this job run sequentially
      (:func:`.sequential.job_client_update`, which :func:`job_algorithm` wires);
    * ``unbatched``: without a job, why (logged when the vectorized backend falls back to
      running the algorithm's clients one at a time);
    * ``sparse_compute``: its clients train a masked sparse model or a sub-model, so a system
      section's clock charges each weight's nonzero fraction of its FLOPs
      (:mod:`fedcomm.system.flops`), not the dense model's;
    * ``delta_uplink``: its decoded uplink is the client's change ``Δ = w_k - w_v`` from the
      global model it downloaded (``global_params``, sent whole), and its server step is a
      weighted average of those deltas through its server optimizer, so a delta may arrive
      stale: asynchronous aggregation (:mod:`fedcomm.simulation.asynchronous`) weighs it by its
      staleness (FedBuff) or re-bases it on the current model (FedAsync). Without it the
      algorithm's server step needs synchronous rounds and asynchronous aggregation refuses it.
    """

    client_job: ClientJob | None = None
    unbatched: str | None = None
    sparse_compute: bool = False
    delta_uplink: bool = False


@dataclass(frozen=True)
class FedAlgorithm(Generic[S]):
    """An FL algorithm as a value of pure functions over explicit state; ``S`` is its server
    state's type."""

    name: str
    config: AlgorithmConfig
    init_server: Callable[[ParamDict, RoundContext], S]
    init_client: Callable[[int], ClientState]
    broadcast: Callable[[S, int, ClientState, RoundContext], Payload]
    client_update: Callable[
        [Mapping[str, Tensor], ClientState, ClientData, ClientContext], ClientResult
    ]
    server_update: Callable[[S, Sequence[Uplink], RoundContext], S]
    global_params: Callable[[S], ParamDict]
    server_metrics: Callable[[S], Mapping[str, float]] = lambda s: {}
    # the model a client's (possibly compressed) upload stands for, from the decoded downlink and
    # uplink; the loop evaluates it for local accuracy when an uplink compressor changed the payload
    uploaded_model: Callable[[Mapping[str, Tensor], Mapping[str, Tensor]], ParamDict] | None = None
    # raises ValueError if the algorithm cannot run on this model (checked before any training)
    validate_model: Callable[[nn.Module], None] | None = None
    # work before round 1 on clients' train splits (indexed by client id); its messages are
    # charged as round 0
    warm_start: (
        Callable[[S, Sequence[ClientData], WarmStartContext], tuple[S, Sequence[Message]]] | None
    ) = None
    # the structure trained and evaluated, built around the registry's model (deterministic in
    # the seed): ProgFed's progressive net with temporary heads; raises ValueError if impossible
    prepare_model: Callable[[nn.Module, int], nn.Module] | None = None
    # how the simulator may run it: the backends' and the clock's hints
    execution: Execution = Execution()


def no_client_state(client_id: int) -> None:
    """``init_client`` of an algorithm whose clients keep nothing between rounds."""
    return None


def server_params(state: Any) -> ParamDict:
    """``global_params`` of an algorithm whose server state keeps the model in ``params``."""
    params: ParamDict = state.params
    return params


def job_algorithm(
    cfg: AlgorithmConfig,
    *,
    init_server: Callable[[ParamDict, RoundContext], S],
    broadcast: Callable[[S, int, ClientState, RoundContext], Payload],
    client_job: ClientJob,
    server_update: Callable[[S, Sequence[Uplink], RoundContext], S],
    sparse_compute: bool = False,
    delta_uplink: bool = False,
    **optional: Any,
) -> FedAlgorithm[S]:
    """The common shape of an algorithm: its local training a job (run sequentially by
    ``client_update``, batched by the vectorized backend), clients without state unless
    ``init_client`` is given, the model evaluated being the server state's ``params`` unless
    ``global_params`` is given; ``sparse_compute`` and ``delta_uplink`` as
    :class:`Execution`'s; ``optional`` sets
    any other :class:`FedAlgorithm` field."""
    return FedAlgorithm(
        **{"init_client": no_client_state, "global_params": server_params, **optional},
        name=cfg.name,
        config=cfg,
        init_server=init_server,
        broadcast=broadcast,
        client_update=job_client_update(client_job),
        server_update=server_update,
        execution=Execution(
            client_job=client_job, sparse_compute=sparse_compute, delta_uplink=delta_uplink
        ),
    )


# --- shared pieces every algorithm composes ------------------------------------------------

MEMBER_PREFIX = "member"  # ensemble algorithms return "member<k>.<param>" keys from global_params


def join_members(members: Sequence[Mapping[str, Tensor]]) -> ParamDict:
    """Ensemble members as one flat parameter dict (``member<k>.<name>``), e.g. to save them."""
    return {f"{MEMBER_PREFIX}{k}.{n}": t for k, m in enumerate(members) for n, t in m.items()}


def split_members(params: Mapping[str, Tensor]) -> list[ParamDict]:
    """Inverse of :func:`join_members`; a plain parameter dict is a one-member list."""
    if not params or not all(k.startswith(MEMBER_PREFIX) for k in params):
        return [dict(params)]
    members: dict[int, ParamDict] = {}
    for key, t in params.items():
        head, _, name = key.partition(".")
        members.setdefault(int(head[len(MEMBER_PREFIX) :]), {})[name] = t
    return [members[k] for k in sorted(members)]


def sender_mean(tensors: Sequence[Mapping[str, Tensor]], weights: Sequence[float]) -> ParamDict:
    """``Σ_k w_k t_k / Σ_{k: t_k ≠ 0} w_k`` per entry (0 where every ``t_k`` is 0): each entry
    averaged over the clients whose decoded upload carries it, e.g. a top-k upload's positions."""
    if not tensors or float(sum(weights)) <= 0:
        raise ValueError(f"sender_mean needs tensors and weights summing to > 0, got {weights}")
    out: ParamDict = {}
    for name in tensors[0]:
        num = torch.zeros_like(tensors[0][name])
        den = torch.zeros_like(num)
        for t, w in zip(tensors, weights, strict=True):
            num.add_(t[name], alpha=w)
            den.add_((t[name] != 0).to(num.dtype), alpha=w)
        out[name] = torch.where(den > 0, num / den.clamp_min(1e-30), 0.0)
    return out


def weighted_mean(
    tensors: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    keys: Sequence[str] | None = None,
) -> ParamDict:
    """``Σ_k w_k t_k / Σ_k w_k`` per key (keys default to those of the first mapping)."""
    if not tensors:
        raise ValueError("weighted_mean of no tensors")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"weights must sum to > 0, got {list(weights)}")
    names = list(tensors[0]) if keys is None else list(keys)
    out: ParamDict = {}
    for name in names:
        acc = torch.zeros_like(tensors[0][name])
        for t, w in zip(tensors, weights, strict=True):
            acc.add_(t[name], alpha=w / total)
        out[name] = acc
    return out


def client_weights(uplinks: Sequence[Uplink], weighting: str) -> list[float]:
    """Aggregation weights: by example count (``num_examples``) or equal (``uniform``)."""
    if weighting == "uniform":
        return [1.0] * len(uplinks)
    return [float(u.num_examples) for u in uplinks]


def subtract(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> ParamDict:
    """``a - b`` per key of ``a``."""
    return {k: a[k] - b[k] for k in a}


def clone_params(params: Mapping[str, Tensor]) -> ParamDict:
    """Detached copies."""
    return {k: v.detach().clone() for k, v in params.items()}
