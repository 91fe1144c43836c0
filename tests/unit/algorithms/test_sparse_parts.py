"""The named pieces FedDST and PruneFL are built from (issue 18): FedDST's annealed ratio (Eq. 2),
prune and regrow, its client's readjustment plan and downlink cache; PruneFL's messages, its
mask update's schedule and gradient mean; the shared mask churn."""

from __future__ import annotations

import math

import pytest
import torch
from torch import Tensor

from fedcomm.algorithms.core import ClientContext, ClientData, Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.feddst import client as dst_client
from fedcomm.algorithms.feddst import readjust as dst_readjust
from fedcomm.algorithms.feddst.comm import Downlinks, mask_charge
from fedcomm.algorithms.prunefl import algorithm as prunefl
from fedcomm.algorithms.prunefl.client import GRAD, downlink, mean_gradient, pack, unpack
from fedcomm.algorithms.sparse import churn
from fedcomm.algorithms.sparse import codec as _codec
from fedcomm.algorithms.sparse import masks as _masks
from fedcomm.comm.payload import Free, Mask


def test_annealed_ratio_is_eq_2_and_gate_only_keeps_alpha() -> None:
    assert dst_readjust.annealed_ratio(0.4, 0, 10, "cosine") == pytest.approx(0.4)
    assert dst_readjust.annealed_ratio(0.4, 5, 10, "cosine") == pytest.approx(0.2)
    assert dst_readjust.annealed_ratio(0.4, 9, 10, "cosine") == pytest.approx(
        0.2 * (1 + math.cos(0.9 * math.pi))
    )
    assert dst_readjust.annealed_ratio(0.4, 9, 10, "gate_only") == 0.4
    assert dst_readjust.annealed_ratio(0.4, 10, 10, "gate_only") == 0.0
    assert dst_readjust.pruned_sparsity(0.8, 0.5) == pytest.approx(0.9)


def test_prune_then_regrow_is_readjust() -> None:
    theta = torch.tensor([0.9, -0.5, 0.0, 0.3, 0.0, -0.1])
    mask = torch.tensor([True, True, False, True, False, True])
    grad = torch.tensor([0.0, 0.8, 0.7, 0.1, 0.2, 0.6])
    kept = dst_readjust.prune(theta, mask, 2)
    assert kept.tolist() == [True, True, False, False, False, False]
    grown = dst_readjust.regrow(grad, kept, 4, "all")  # |g| over all entries: 1, 2 (active 1 reset)
    assert grown.tolist() == [False, True, True, False, False, False]
    params, masks = dst_readjust.readjust(
        {"w": theta}, {"w": mask}, {"w": grad}, {"w": 2}, {"w": 4}, "all"
    )
    assert masks["w"].tolist() == (kept | grown).tolist()
    assert params["w"].tolist() == pytest.approx([0.9, 0, 0, 0, 0, 0])


def test_churn_is_the_changed_fraction_of_all_maskable_entries() -> None:
    old = {"a": torch.tensor([True, False]), "b": torch.tensor([[True, True], [False, False]])}
    new = {"a": torch.tensor([True, True]), "b": torch.tensor([[False, True], [False, False]])}
    assert churn(old, new) == 2 / 6
    assert churn(old, old) == 0.0


def _data(n: int) -> ClientData:
    return ClientData(torch.zeros(n, 3), torch.zeros(n, dtype=torch.long))


def _ctx(epochs: int) -> ClientContext:
    local = LocalConfig(epochs=epochs, batch_size=4)
    return ClientContext(1, 0, torch.nn.Identity(), local, torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("at_epoch", "expected"), [(None, 8), (0, 2), (1, 5), (7, 8)])
def test_client_readjusts_after_the_chosen_epoch(at_epoch: int | None, expected: int) -> None:
    batches, at = dst_client.plan(_data(10), _ctx(3), True, at_epoch)  # 3 batches an epoch
    assert len(batches) == 9 and at == expected
    assert dst_client.plan(_data(10), _ctx(3), False, None)[1] == -1
    assert dst_client.plan(_data(0), _ctx(3), True, None)[1] == -1


def test_downlinks_are_encoded_once_per_state_and_kind() -> None:
    params = {"w": torch.tensor([1.0, 2.0, 3.0]), "b": torch.tensor([0.5])}
    masks = {"w": torch.tensor([True, False, True])}
    sent, state = Downlinks(), object()
    first = sent.get(state, params, masks, "sent", False)
    assert sent.get(state, params, masks, "sent", False) is first
    assert sent.get(state, params, masks, "known", False) is not first
    assert sent.get(object(), params, masks, "sent", False) is not first
    assert mask_charge(None, "ones", "ones") == "known" and mask_charge("x", "ones", "y") == "sent"
    assert isinstance(first[_codec.MASK + "w"], Mask)


def test_prunefl_messages_round_trip_on_the_mask() -> None:
    params: dict[str, Tensor] = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.ones(2)}
    masks = {"w": torch.tensor([[True, False], [False, True]])}
    down = downlink(params, masks, version=3, fresh=True)
    assert isinstance(down["mask/w"], Free) and int(down.decode()["mask_version"]) == 3
    assert isinstance(downlink(params, masks, 3, fresh=False)["mask/w"], Mask)
    got = unpack({k: e.decode() for k, e in pack(params, masks).items()}, params, masks)
    assert got["w"].tolist() == [[1.0, 0.0], [0.0, 4.0]] and got["b"].tolist() == [1.0, 1.0]
    assert prunefl.masked is _masks.apply_masks


def test_prunefl_averages_the_uploaded_gradients_unweighted() -> None:
    masks = {"w": torch.ones(2, 2, dtype=torch.bool)}
    ups = [
        Uplink(0, 10, {GRAD + "w": torch.tensor([1.0, 2.0, 3.0, 4.0])}),
        Uplink(1, 1, {GRAD + "w": torch.tensor([3.0, 2.0, 1.0, 0.0])}),
    ]
    mean = mean_gradient(ups, masks)
    assert mean["w"].shape == (2, 2) and mean["w"].tolist() == [[2.0, 2.0], [2.0, 2.0]]
