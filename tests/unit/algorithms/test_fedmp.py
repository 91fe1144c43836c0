"""FedMP (fixed ratio) against the spec (specs/fedsparse-fedbiad.md §2.5): smallest-L1 unit
pruning, R2SP recovery and aggregation, pattern + sub-model accounting, masked training, and the
reduction to FedAvg with no pruning."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import build_algorithm, fedavg, feddrop, fedmp
from fedcomm.algorithms.core import AlgorithmConfig, ClientContext, RoundContext, Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.submodel.codec import encode_kept, keep_masks
from fedcomm.algorithms.submodel.units import drop_counts, param_masks, unit_layers
from fedcomm.comm.codecs import build_compressor
from fedcomm.comm.payload import Mask
from fedcomm.models import build_model
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _mlp(
    hidden: list[int], input_shape: tuple[int, ...] = (1, 8, 8), classes: int = 10
) -> nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=input_shape, num_classes=classes, hidden=hidden)


def _params(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _run(
    fed: FederatedTensors, cfg: AlgorithmConfig, model: nn.Module, rounds: int = 2
) -> loop.RunResult:
    lc = loop.LoopConfig(
        rounds=rounds, clients_per_round=3, local=LocalConfig(steps=4, batch_size=16), seed=7
    )
    return loop.run(lc, build_algorithm(cfg), model, fed, build_compressor("none"), config_hash="t")


def test_prunes_the_smallest_l1_units_by_hand() -> None:
    model = _mlp([4], input_shape=(1, 1, 2), classes=3)  # 2 -> 4 -> 3
    layers = unit_layers(model)
    params = {
        # row L1 norms incl. bias: 3, 1, 4, 1 (units 1 and 3 tie: the lower index goes first)
        "fc1.weight": torch.tensor([[1.0, -1.0], [0.5, 0.0], [-2.0, 1.0], [0.0, -0.5]]),
        "fc1.bias": torch.tensor([1.0, -0.5, 1.0, 0.5]),
        "fc2.weight": torch.zeros(3, 4),  # the output layer: all-zero, yet never pruned
        "fc2.bias": torch.zeros(3),
    }
    norms = fedmp.unit_l1_norms(layers[0], params)
    assert norms.tolist() == [3.0, 1.0, 4.0, 1.0]
    keep = fedmp.prune_units(layers, params, 0.5)  # round(0.5·4) = 2 pruned
    assert keep["fc1"].tolist() == [True, False, True, False]
    assert keep["fc2"].all()
    assert fedmp.prune_units(layers, params, 0.25)["fc1"].tolist() == [True, False, True, True]
    masks = param_masks(layers, keep, params)  # pruned units take the next inputs along
    assert not masks["fc1.weight"][[1, 3]].any() and not masks["fc1.bias"][[1, 3]].any()
    assert not masks["fc2.weight"][:, [1, 3]].any() and masks["fc2.weight"][:, [0, 2]].all()


def test_r2sp_recovery_fills_pruned_positions_with_global_values_by_hand() -> None:
    glob = {"w": torch.tensor([1.0, 2.0, 3.0])}
    sub_a, keep_a = {"w": torch.tensor([10.0, 0.0, 30.0])}, {"w": torch.tensor([True, False, True])}
    sub_b, keep_b = {"w": torch.tensor([0.0, 20.0, 0.0])}, {"w": torch.tensor([False, True, False])}
    assert fedmp.recover(glob, sub_a, keep_a)["w"].tolist() == [10.0, 2.0, 30.0]
    assert fedmp.recover(glob, sub_b, keep_b)["w"].tolist() == [1.0, 20.0, 3.0]
    # weights 1 and 3: [(10 + 3)/4, (2 + 60)/4, (30 + 9)/4]
    agg = fedmp.r2sp(glob, [sub_a, sub_b], [keep_a, keep_b], [1.0, 3.0])
    assert agg["w"].tolist() == pytest.approx([3.25, 15.5, 9.75])


def test_server_update_is_the_r2sp_average() -> None:
    model = _mlp([6])
    params = _params(model)
    alg = build_algorithm(fedmp.Config())
    rctx = RoundContext(1, torch.Generator(), 0, model)
    state = alg.init_server(params, rctx)
    layers = unit_layers(model)
    g = torch.Generator().manual_seed(1)
    subs, keeps, ups = [], [], []
    for cid, (n, p) in enumerate([(2, 0.5), (5, 0.2)]):  # two different sub-models
        unit_keep = feddrop.select_units(layers, drop_counts(layers, p, p, False), 0, 1, cid)
        keep = param_masks(layers, unit_keep, params)
        delta = {k: torch.randn(v.shape, generator=g) * keep[k] for k, v in params.items()}
        subs.append({k: params[k] * keep[k] + delta[k] for k in params})
        keeps.append(keep)
        ups.append(Uplink(cid, n, {k: e.decode() for k, e in encode_kept(delta, keep).items()}))
    new = alg.server_update(state, ups, rctx)
    want = fedmp.r2sp(params, subs, keeps, [2.0, 5.0])
    for k in params:
        torch.testing.assert_close(new.params[k], want[k])


def test_client_trains_the_pruned_sub_model(fed: FederatedTensors) -> None:
    model = _mlp([16])
    params = _params(model)
    alg = build_algorithm(fedmp.Config(p=0.25))
    rctx = RoundContext(1, torch.Generator(), 0, model)
    payload = alg.broadcast(alg.init_server(params, rctx), 1, None, rctx)
    assert isinstance(payload["unit/fc1"], Mask)
    down = payload.decode()
    want = fedmp.prune_units(unit_layers(model), params, 0.25)
    assert torch.equal(down["unit/fc1"], want["fc1"]) and int((~want["fc1"]).sum()) == 4
    keep = keep_masks(down)
    cctx = ClientContext(
        1, 1, model, LocalConfig(steps=3, lr=0.1), torch.Generator().manual_seed(0)
    )
    res = alg.client_update(down, None, fed.train[1], cctx)
    for k, m in keep.items():
        assert not res.local_params[k][~m].any()  # pruned entries stay zero
    assert res.metrics["fedmp/submodel_fraction"] < 1.0
    assert alg.uploaded_model is not None
    rebuilt = alg.uploaded_model(down, res.uplink.decode())
    for k, v in res.local_params.items():
        torch.testing.assert_close(rebuilt[k], v)


def test_bits_sub_model_entries_plus_the_unit_pattern_down(fed: FederatedTensors) -> None:
    # mlp 64-4-2-10, p = 0.5: 153 sub-model entries (as in FedDrop's test) -> 4896 bits each way;
    # the downlink adds the hidden units' pattern, 4 + 2 bits
    frame = _run(fed, fedmp.Config(p=0.5), _mlp([4, 2]), rounds=1).ledger.frame()
    rows = frame.select("direction", "payload_bits", "index_bits", "meta_bits").iter_rows()
    assert set(rows) == {("down", 4896 + 6, 0, 0), ("up", 4896, 0, 0)}


def test_no_pruning_equals_fedavg(fed: FederatedTensors) -> None:
    pruned = _run(fed, fedmp.Config(p=0.0), _mlp([16]), rounds=3)
    avg = _run(fed, fedavg.Config(weighting="num_examples"), _mlp([16]), rounds=3)
    assert all(torch.equal(pruned.final_params[k], avg.final_params[k]) for k in avg.final_params)
    for a, b in zip(pruned.state.round_rows, avg.state.round_rows, strict=True):
        assert a["global/accuracy"] == b["global/accuracy"]
        assert a["local/accuracy"] == b["local/accuracy"]
    p, f = pruned.ledger.frame(), avg.ledger.frame()
    extra = (p["payload_bits"] - f["payload_bits"]).to_list()
    down = (p["direction"] == "down").to_list()
    assert extra == [16 if d else 0 for d in down]  # the 16-unit pattern, downlink only
    assert sum(down) == len(down) // 2
