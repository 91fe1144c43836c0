"""The machinery every algorithm shares; it imports no algorithm and no paper package.

* :mod:`.contract`: what an algorithm is (:class:`FedAlgorithm`, :class:`AlgorithmConfig`) and
  the pieces every algorithm composes (weighted means, ensemble members);
* :mod:`.registry`: ``@register(Config)`` and :func:`build_algorithm`;
* :mod:`.context`: what the round loop hands an algorithm and takes back (contexts, client
  data, results, uplinks);
* :mod:`.jobs` (local training as data, and the step both backends run), :mod:`.sequential`
  (the sequential executor), :mod:`.local` (the local step), :mod:`.sgd` (the SGD rule, batch
  schedule, Adamax for auxiliary tensors);
* :mod:`.grouped` (group-sparse views and codecs), :mod:`.reuse` (one computation shared by a
  round's clients).

The sparse-mask family's masks, budgets and messages are :mod:`fedcomm.algorithms.sparse`.

This package re-exports the contract's, the registry's and the context's public names, so an
algorithm imports them from ``fedcomm.algorithms.core``.
"""

from __future__ import annotations

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
from fedcomm.algorithms.core.contract import (
    MEMBER_PREFIX,
    AlgorithmConfig,
    Execution,
    FedAlgorithm,
    client_weights,
    clone_params,
    job_algorithm,
    join_members,
    no_client_state,
    sender_mean,
    server_params,
    split_members,
    subtract,
    weighted_mean,
)
from fedcomm.algorithms.core.registry import (
    ALGORITHMS,
    CONFIGS,
    Builder,
    build_algorithm,
    config_name,
    register,
)

__all__ = [
    "ALGORITHMS",
    "CONFIGS",
    "MEMBER_PREFIX",
    "AlgorithmConfig",
    "Builder",
    "ClientContext",
    "ClientData",
    "ClientResult",
    "ClientState",
    "Execution",
    "FedAlgorithm",
    "Message",
    "RoundContext",
    "Uplink",
    "WarmStartContext",
    "build_algorithm",
    "client_weights",
    "clone_params",
    "config_name",
    "job_algorithm",
    "join_members",
    "no_client_state",
    "register",
    "sender_mean",
    "server_params",
    "split_members",
    "subtract",
    "weighted_mean",
]
