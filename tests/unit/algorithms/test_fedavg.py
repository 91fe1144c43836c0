"""FedAvg's server rule by hand: ``average: all`` (every client) vs ``senders`` (each entry over
the clients whose decoded upload carries it)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcomm.algorithms import build_algorithm, fedavg
from fedcomm.algorithms.core import RoundContext, Uplink, sender_mean


def test_sender_mean_by_hand() -> None:
    # weights 1 and 3; entry 0 sent by both, entry 1 by A only, entry 2 by nobody
    a, b = {"w": torch.tensor([2.0, 4.0, 0.0])}, {"w": torch.tensor([6.0, 0.0, 0.0])}
    out = sender_mean([a, b], [1.0, 3.0])["w"]
    torch.testing.assert_close(out, torch.tensor([(2 + 18) / 4, 4.0, 0.0]))


def test_sender_mean_refuses_no_weight() -> None:
    with pytest.raises(ValueError, match="sender_mean"):
        sender_mean([{"w": torch.ones(1)}], [0.0])


@pytest.mark.parametrize(("average", "entry_1"), [("all", 1.0), ("senders", 4.0)])
def test_server_update_averages_sparse_entries_as_configured(average: str, entry_1: float) -> None:
    model = nn.Linear(3, 1, bias=False)
    prev = {"weight": torch.zeros(1, 3)}
    alg = build_algorithm(fedavg.Config(average=average))  # type: ignore[arg-type]
    state = alg.init_server(prev, RoundContext(0, torch.Generator(), 0, model))
    ups = [
        Uplink(0, 1, {"weight": torch.tensor([[2.0, 4.0, 0.0]])}),
        Uplink(1, 3, {"weight": torch.tensor([[6.0, 0.0, 0.0]])}),
    ]
    new = alg.server_update(state, ups, RoundContext(1, torch.Generator(), 0, model))
    torch.testing.assert_close(new.params["weight"], torch.tensor([[5.0, entry_1, 0.0]]))
