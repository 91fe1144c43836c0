"""Round 0: a fresh run's state, before any round (the loop resumes a checkpoint instead).

The server state is ``algorithm.init_server`` of the model's initial parameters, with the
generator ``(seed, SERVER, 0)``. An algorithm with a warm start (GraSP's pruning at
initialisation, PruneFL's phase one) then runs it with the same generator, and the messages it
exchanged are the ledger's round-0 rows.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from fedcomm.algorithms.core import FedAlgorithm, RoundContext, WarmStartContext
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.ledger import Ledger
from fedcomm.seeding import Stream, torch_generator
from fedcomm.simulation import checkpoint
from fedcomm.simulation.data import FederatedTensors


def initial_state(
    algorithm: FedAlgorithm[Any],
    model: nn.Module,
    data: FederatedTensors,
    seed: int,
    local: LocalConfig,
    config_hash: str,
) -> checkpoint.RunState:
    """The state of a run that has trained no round yet."""
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    state = checkpoint.RunState(config_hash=config_hash)
    gen = torch_generator(seed, Stream.SERVER, 0)
    state.server = algorithm.init_server(init, RoundContext(0, gen, seed, model))
    if algorithm.warm_start is not None:  # e.g. GraSP, PruneFL phase one: round 0
        warm = Ledger([])
        wctx = WarmStartContext(gen, seed, model, local)
        state.server, messages = algorithm.warm_start(state.server, data.train, wctx)
        for cid, direction, payload in messages:
            warm.record(0, cid, direction, payload)
        state.ledger_rows = warm.rows
    return state
