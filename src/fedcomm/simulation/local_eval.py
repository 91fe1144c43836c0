"""The client store and local accuracy: each client's record between its participations, and
the evaluation of its newest upload on its own test split.

With ``local_eval_every = 1`` each upload is evaluated as it arrives (:func:`evaluate_upload`). With
``n > 1`` an upload is copied to the CPU and kept in the client's record (``pending``) until
local evaluation is due (every ``n``-th round and the last): then :func:`evaluate_pending`
evaluates every kept upload once, in client id order, and fills in the client row of the round
it was uploaded; the other clients' last results are reused (:func:`local_metrics`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from fedcomm.evaluation.metrics import evaluate
from fedcomm.simulation import checkpoint
from fedcomm.simulation.data import FederatedTensors
from fedcomm.simulation.round_metrics import weighted


@dataclass
class ClientRecord:
    """What the client store keeps per client between its participations."""

    state: Any = None
    compressor_state: Any = None
    local_accuracy: float | None = None  # of its last upload, on its own test split
    local_loss: float | None = None
    test_n: int = 0
    pending: Any = None  # its last upload on the CPU, not yet evaluated (local_eval_every > 1)
    pending_row: int | None = None  # its index in the run's client rows


LocalResult = tuple[float | None, float | None, int]  # accuracy, loss, test examples


def evaluate_upload(
    model: nn.Module, params: Any, data: FederatedTensors, cid: int, batch_size: int
) -> LocalResult:
    """Client ``cid``'s model ``params`` on its own test split."""
    test = data.test[cid]
    local = evaluate(model, params, test.x, test.y, batch_size=batch_size)
    return (local.accuracy if local.n else None, local.loss if local.n else None, local.n)


def last_result(record: ClientRecord | None) -> LocalResult:
    """The client's last local result (none before its first)."""
    if record is None:
        return (None, None, 0)
    return (record.local_accuracy, record.local_loss, record.test_n)


def copy_to(params: Any, dev: torch.device) -> Any:
    """``params`` (a mapping of tensors, or a list of them) copied to ``dev``."""
    if isinstance(params, Mapping):
        return {k: v.detach().to(dev, copy=True) for k, v in params.items()}
    return [copy_to(p, dev) for p in params]


def evaluate_pending(
    state: checkpoint.RunState, model: nn.Module, data: FederatedTensors, batch_size: int
) -> None:
    """Evaluate every upload kept since the last local evaluation (clients in id order): its
    result goes to the client's record and to the client row of the round it was uploaded."""
    dev = data.global_test.x.device
    for cid in sorted(c for c, r in state.clients.items() if r.pending is not None):
        record = state.clients[cid]
        result = evaluate_upload(model, copy_to(record.pending, dev), data, cid, batch_size)
        record.local_accuracy, record.local_loss, record.test_n = result
        if record.pending_row is not None:
            row = state.client_rows[record.pending_row]
            row["local_accuracy"], row["local_loss"], row["test_n"] = result
        record.pending, record.pending_row = None, None


def local_metrics(clients: Mapping[int, ClientRecord], num_clients: int) -> dict[str, float | None]:
    """Local accuracy over clients that have uploaded (unweighted and test-size weighted)."""
    seen = [r for r in clients.values() if r.local_accuracy is not None]
    if not seen:
        return {"local/accuracy": None, "local/accuracy_weighted": None, "local/coverage": 0.0}
    accs = [float(r.local_accuracy) for r in seen if r.local_accuracy is not None]
    return {
        "local/accuracy": float(np.mean(accs)),
        "local/accuracy_weighted": weighted(accs, [r.test_n for r in seen]),
        "local/coverage": len(clients) / num_clients,
    }
