"""The sub-model dropout family's shared rule: FedDrop, AFD, FedMP, FjORD and HeteroFL (and
FedBIAD's row selection) each compose these pieces with a config of their own.

* :mod:`.family`: one method as a composition of a selection, the codec and an aggregation
  (:func:`algorithm`), and the masked client every member runs (:func:`masked_client`);
* :mod:`.units`: the unit graph of a model (hidden units, channels, LSTM rows), keep counts and
  ranking rules;
* :mod:`.codec`: the sub-model's values down and its delta up, with the unit pattern;
* :mod:`.merge`: masked, recovered and nested means of the clients' deltas.

It imports no algorithm and no paper package. This package re-exports :mod:`.family`'s names.
"""

from __future__ import annotations

from fedcomm.algorithms.submodel.family import (
    KEPT,
    SUBMODEL,
    Keep,
    Selection,
    ServerState,
    algorithm,
    hidden_scaler,
    masked_client,
    masked_grads,
    submodel_job,
    submodel_result,
)

__all__ = [
    "KEPT",
    "SUBMODEL",
    "Keep",
    "Selection",
    "ServerState",
    "algorithm",
    "hidden_scaler",
    "masked_client",
    "masked_grads",
    "submodel_job",
    "submodel_result",
]
