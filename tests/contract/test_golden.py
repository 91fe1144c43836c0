"""Golden values: one FedAvg round on two hand-sized clients (FedJAX `fed_avg_test` style)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcomm.algorithms import build_algorithm, fedavg
from fedcomm.algorithms.core import ClientContext, ClientData, RoundContext, Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.ledger import Ledger
from fedcomm.server_opt import ServerOptConfig


def _round(weighting: str) -> tuple[torch.Tensor, Ledger]:
    # Model: logits = W x with W (2, 1), starting at 0 -> softmax = [0.5, 0.5] for any x.
    # Cross-entropy gradient for one example: dL/dW = (p - onehot(y)) x^T.
    #   client A: two copies of (x=1, y=0), one batch of 2: grad = [[-0.5], [0.5]]
    #             -> W_A = 0 - 0.1 * grad = [[0.05], [-0.05]];  n_A = 2
    #   client B: one example (x=3, y=1): grad = [[0.5*3], [-0.5*3]] = [[1.5], [-1.5]]
    #             -> W_B = [[-0.15], [0.15]];                   n_B = 1
    # Example-weighted FedAvg (server sgd, lr 1): W = (2*W_A + 1*W_B) / 3
    #   = [[(0.10 - 0.15)/3], [(-0.10 + 0.15)/3]] = [[-1/60], [1/60]]
    # Uniform weighting: W = (W_A + W_B)/2 = [[-0.05], [0.05]]
    model = nn.Linear(1, 2, bias=False)
    alg = build_algorithm(
        fedavg.Config(weighting=weighting, server=ServerOptConfig(optimizer="sgd", lr=1.0))
    )  # type: ignore[arg-type]
    ctx = RoundContext(1, torch.Generator().manual_seed(0))
    state = alg.init_server({"weight": torch.zeros(2, 1)}, ctx)
    clients = {
        0: ClientData(torch.tensor([[1.0], [1.0]]), torch.tensor([0, 0])),
        1: ClientData(torch.tensor([[3.0]]), torch.tensor([1])),
    }
    ledger, uplinks = Ledger(), []
    for cid, data in clients.items():
        down = alg.broadcast(state, cid, None, ctx)
        ledger.record(1, cid, "down", down)
        cctx = ClientContext(
            1,
            cid,
            model,
            LocalConfig(epochs=1, batch_size=2, lr=0.1),
            torch.Generator().manual_seed(cid),
        )
        res = alg.client_update(down.decode(), None, data, cctx)
        ledger.record(1, cid, "up", res.uplink)
        uplinks.append(Uplink(cid, res.num_examples, res.uplink.decode()))
    state = alg.server_update(state, uplinks, ctx)
    return alg.global_params(state)["weight"], ledger


def test_fedavg_one_round_example_weighted() -> None:
    w, ledger = _round("num_examples")
    assert w.flatten().tolist() == pytest.approx([-1 / 60, 1 / 60], abs=1e-7)
    # each message: 2 fp32 values = 64 bits, both directions, both clients
    assert [r[3] for r in ledger.rows] == [64, 64, 64, 64]


def test_fedavg_one_round_uniform() -> None:
    w, _ = _round("uniform")
    assert w.flatten().tolist() == pytest.approx([-0.05, 0.05], abs=1e-7)
