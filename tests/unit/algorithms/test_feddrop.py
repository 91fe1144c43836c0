"""FedDrop against the spec (specs/fedsparse-fedbiad.md §1.6): replayable exact-count unit
selection, the unit graph (incl. conv -> fc through a flatten), sub-model accounting, masked
training, per-entry aggregation, and the reduction to FedAvg with no dropout."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import build_algorithm, fedavg, feddrop, submodel
from fedcomm.algorithms.core import AlgorithmConfig, ClientContext, RoundContext, Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.submodel.codec import decode_kept, keep_masks
from fedcomm.algorithms.submodel.merge import aggregate
from fedcomm.algorithms.submodel.units import drop_counts, param_masks, unit_layers
from fedcomm.comm.codecs import build_compressor
from fedcomm.models import build_model
from fedcomm.server_opt import ServerOptConfig
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _mlp(hidden: list[int], input_shape: tuple[int, ...] = (1, 8, 8)) -> nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=input_shape, num_classes=10, hidden=hidden)


def _params(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _run(
    fed: FederatedTensors, cfg: AlgorithmConfig, model: nn.Module, rounds: int = 2
) -> loop.RunResult:
    lc = loop.LoopConfig(
        rounds=rounds, clients_per_round=3, local=LocalConfig(steps=4, batch_size=16), seed=7
    )
    return loop.run(lc, build_algorithm(cfg), model, fed, build_compressor("none"), config_hash="t")


def test_selection_is_exact_count_replayable_and_per_client() -> None:
    layers = unit_layers(_mlp([40, 20]))
    counts = drop_counts(layers, conv_rate=0.1, fc_rate=0.3, drop_output=False)
    assert counts == {"fc1": 12, "fc2": 6, "fc3": 0}  # round(0.3·40), round(0.3·20), output kept
    keep = feddrop.select_units(layers, counts, seed=3, round_=5, client_id=2)
    assert {k: int((~m).sum()) for k, m in keep.items()} == counts
    again = feddrop.select_units(layers, counts, seed=3, round_=5, client_id=2)
    assert all(torch.equal(keep[k], again[k]) for k in keep)
    for other in ((3, 5, 1), (3, 6, 2), (4, 5, 2)):  # another client, round or seed
        drawn = feddrop.select_units(layers, counts, *other)
        assert not torch.equal(drawn["fc1"], keep["fc1"])
    with_output = drop_counts(layers, 0.1, 0.3, drop_output=True)
    assert with_output["fc3"] == 3
    tiny = unit_layers(_mlp([2]))
    assert drop_counts(tiny, 0.1, 0.9, False)["fc1"] == 1  # round(1.8) -> keep one unit


def test_rates_are_validated() -> None:
    for bad in ({"fc_rate": 1.0}, {"conv_rate": -0.1}):
        with pytest.raises(ValidationError):
            feddrop.Config(**bad)


def test_conv_to_fc_flatten_mapping_and_sub_network_equivalence() -> None:
    torch.manual_seed(0)
    model = build_model("cnn", input_shape=(3, 32, 32), num_classes=10, channels=[4, 6], hidden=8)
    params = _params(model)
    layers = unit_layers(model)
    assert [(s.name, s.kind, s.count) for s in layers] == [
        ("conv1", "filter", 4),
        ("conv2", "filter", 6),
        ("fc1", "row", 8),
        ("fc2", "row", 10),
    ]
    keep = {s.name: torch.ones(s.count, dtype=torch.bool) for s in layers}
    keep["conv1"][1] = keep["conv2"][2] = keep["fc1"][3] = False
    m = param_masks(layers, keep, params)
    assert not m["conv1.weight"][1].any() and not m["conv1.bias"][1]
    assert not m["conv2.weight"][:, 1].any() and not m["conv2.weight"][2].any()
    assert not m["fc1.weight"][:, 50:75].any()  # conv2 filter 2 -> fc1 inputs [2·25, 3·25)
    assert m["fc1.weight"][torch.arange(8) != 3][:, torch.arange(150) // 25 != 2].all()
    assert not m["fc1.weight"][3].any() and not m["fc2.weight"][:, 3].any()
    assert int(m["fc2.weight"].sum()) == 70 and bool(m["fc2.bias"].all())
    # the masked network computes exactly what the smaller dense network does
    c1, c2, h = (torch.arange(4) != 1), (torch.arange(6) != 2), (torch.arange(8) != 3)
    cols = (torch.arange(150) // 25 != 2).nonzero().squeeze(1)
    small = {
        "conv1.weight": params["conv1.weight"][c1],
        "conv1.bias": params["conv1.bias"][c1],
        "conv2.weight": params["conv2.weight"][c2][:, c1],
        "conv2.bias": params["conv2.bias"][c2],
        "fc1.weight": params["fc1.weight"][h][:, cols],
        "fc1.bias": params["fc1.bias"][h],
        "fc2.weight": params["fc2.weight"][:, h],
        "fc2.bias": params["fc2.bias"],
    }
    x = torch.randn(5, 3, 32, 32)
    small_model = build_model(
        "cnn", input_shape=(3, 32, 32), num_classes=10, channels=[3, 5], hidden=7
    )
    want = torch.func.functional_call(small_model, small, (x,))
    got = torch.func.functional_call(model, {k: v * m[k] for k, v in params.items()}, (x,))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_ledger_counts_32_bits_per_held_entry_each_way(fed: FederatedTensors) -> None:
    # mlp 64-4-2-10, fc_rate 0.5: fc1 keeps 2 of 4 rows (2·64 + 2 bias), fc2 1 of 2 rows reading
    # the 2 kept fc1 units (1·2 + 1), fc3 all 10 rows reading the 1 kept fc2 unit (10·1 + 10):
    # 130 + 3 + 20 = 153 entries -> 32·153 = 4896 bits per message, both ways
    res = _run(fed, feddrop.Config(fc_rate=0.5), _mlp([4, 2]), rounds=1)
    frame = res.ledger.frame()
    assert frame.height == 6  # 3 clients, down + up
    assert set(frame["payload_bits"].to_list()) == {4896}
    assert set(frame["index_bits"].to_list()) | set(frame["meta_bits"].to_list()) == {0}


def test_dropped_entries_stay_zero_and_unheld_entries_are_untouched(
    fed: FederatedTensors,
) -> None:
    model = _mlp([16])
    alg = build_algorithm(feddrop.Config(fc_rate=0.5))
    state = alg.init_server(_params(model), RoundContext(0, torch.Generator(), 1, model))
    for round_ in (1, 2):  # one client a round: half of fc1 is held by nobody
        rctx = RoundContext(round_, torch.Generator(), 1, model)
        down = alg.broadcast(state, 0, None, rctx).decode()
        keep = keep_masks(down)
        cctx = ClientContext(round_, 0, model, LocalConfig(lr=0.1, momentum=0.9), rctx.generator)
        res = alg.client_update(down, None, fed.train[0], cctx)
        for k, m in keep.items():
            assert torch.equal(res.local_params[k][~m], torch.zeros(int((~m).sum())))
            assert not torch.equal(res.local_params[k][m], decode_kept(down)[k][m])
        uplink = Uplink(0, res.num_examples, res.uplink.decode())
        new = alg.server_update(state, [uplink], rctx)
        for k, m in keep.items():  # round 2: Adam has momentum, yet unheld entries stay put
            assert torch.equal(new.params[k][~m], state.params[k][~m])
            assert (new.params[k][m] != state.params[k][m]).any()
        state = new


def test_aggregate_held_and_all_by_hand() -> None:
    ones, first = torch.tensor([True, True]), torch.tensor([True, False])
    deltas = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 0.0])}]
    masks = [{"w": ones}, {"w": first}]
    held, any_held = aggregate(deltas, masks, [1.0, 3.0], "held")
    # entry 0, held by both: (1·1 + 3·3)/4 = 2.5; entry 1, only client 0 holds it: 2
    assert held["w"].tolist() == pytest.approx([2.5, 2.0])
    all_, _ = aggregate(deltas, masks, [1.0, 3.0], "all")
    assert all_["w"].tolist() == pytest.approx([2.5, 0.5])  # entry 1: 1·2 / (1 + 3)
    assert any_held["w"].tolist() == [True, True]
    _, nobody = aggregate(deltas, [{"w": first}, {"w": first}], [1.0, 1.0], "held")
    assert nobody["w"].tolist() == [True, False]


def test_no_dropout_equals_fedavg_with_server_adam(fed: FederatedTensors) -> None:
    adam = ServerOptConfig(optimizer="adam", lr=1e-3)
    drop = _run(fed, feddrop.Config(conv_rate=0.0, fc_rate=0.0), _mlp([16]))
    avg = _run(fed, fedavg.Config(weighting="uniform", server=adam), _mlp([16]))
    assert all(torch.equal(drop.final_params[k], avg.final_params[k]) for k in avg.final_params)
    assert drop.ledger.rows == avg.ledger.rows
    for a, b in zip(drop.state.round_rows, avg.state.round_rows, strict=True):
        assert a["global/accuracy"] == b["global/accuracy"]
        assert a["local/accuracy"] == b["local/accuracy"]
        assert a["feddrop/submodel_fraction"] == 1.0


def test_uploaded_model_is_the_trained_sub_model(fed: FederatedTensors) -> None:
    model = _mlp([16])
    alg = build_algorithm(feddrop.Config())
    rctx = RoundContext(1, torch.Generator(), 0, model)
    down = alg.broadcast(alg.init_server(_params(model), rctx), 4, None, rctx).decode()
    cctx = ClientContext(1, 4, model, LocalConfig(), torch.Generator().manual_seed(0))
    res = alg.client_update(down, None, fed.train[4], cctx)
    assert alg.uploaded_model is not None
    rebuilt = alg.uploaded_model(down, res.uplink.decode())
    for k, v in res.local_params.items():
        torch.testing.assert_close(rebuilt[k], v)


@pytest.mark.parametrize(
    ("name", "shape", "options"),
    [("resnet20", (3, 32, 32), {}), ("lstm", (5,), {"embed_dim": 4, "hidden": 4})],
)
def test_validate_model_rejects_residual_and_recurrent_models(
    name: str, shape: tuple[int, ...], options: dict[str, int]
) -> None:
    alg = build_algorithm(feddrop.Config())
    assert alg.validate_model is not None
    for ok in ("mlp", "mnist_cnn"):
        alg.validate_model(build_model(ok, input_shape=(1, 8, 8), num_classes=10))
    alg.validate_model(build_model("cnn", input_shape=(3, 32, 32), num_classes=10))
    with pytest.raises(ValueError, match="mlp, cnn and mnist_cnn"):
        alg.validate_model(build_model(name, input_shape=shape, num_classes=10, **options))
    model = build_model(name, input_shape=shape, num_classes=10, **options)
    with pytest.raises(ValueError, match="residual or recurrent"):
        alg.init_server(_params(model), RoundContext(0, torch.Generator(), 0, model))


def test_rescale_scales_kept_hidden_units_in_training_and_the_local_model() -> None:
    """``rescale``: inverted dropout. The forward pass of local training divides each hidden
    layer's weight and bias by its kept share (fc_rate 0.5: x2), never the output layer's; the
    local model (local accuracy) is the trained sub-model as it trained, scaled the same way."""
    model = _mlp([40, 20])
    layers = unit_layers(model)
    cfg = feddrop.Config(fc_rate=0.5, rescale=True)
    assert feddrop.keep_shares(cfg, layers) == {"fc1": 0.5, "fc2": 0.5, "fc3": 1.0}
    ones = {k: torch.ones_like(v) for k, v in _params(model).items()}
    scaled = submodel.hidden_scaler(layers, feddrop.keep_shares(cfg, layers))(ones)
    assert {k: float(v.unique()) for k, v in scaled.items()} == {
        "fc1.weight": 2.0,
        "fc1.bias": 2.0,
        "fc2.weight": 2.0,
        "fc2.bias": 2.0,
        "fc3.weight": 1.0,
        "fc3.bias": 1.0,
    }
    fed = digits_federation(6)
    runs = {}
    for rescale in (False, True):
        alg = build_algorithm(feddrop.Config(fc_rate=0.5, rescale=rescale))
        rctx = RoundContext(1, torch.Generator(), 0, model)
        down = alg.broadcast(alg.init_server(_params(model), rctx), 2, None, rctx).decode()
        cctx = ClientContext(1, 2, model, LocalConfig(lr=0.1), torch.Generator().manual_seed(0))
        runs[rescale] = (alg, down, alg.client_update(down, None, fed.train[2], cctx))
    (_, _, plain), (alg, down, res) = runs[False], runs[True]
    assert not torch.equal(plain.local_params["fc1.weight"], res.local_params["fc1.weight"])
    trained = decode_kept(down)  # the sub-model plus its delta = the trained weights
    delta = decode_kept(res.uplink.decode())
    for k in ("fc1.weight", "fc2.bias", "fc3.weight"):
        factor = 1.0 if k.startswith("fc3") else 2.0
        torch.testing.assert_close(res.local_params[k], factor * (trained[k] + delta[k]))
    assert alg.uploaded_model is not None  # the compressor path rebuilds the same model
    rebuilt = alg.uploaded_model(down, res.uplink.decode())
    for k, v in res.local_params.items():
        torch.testing.assert_close(rebuilt[k], v)


def test_rescale_on_is_the_default_and_off_differs(fed: FederatedTensors) -> None:
    # on by default: the reading fedsparse-t1-feddrop-rescale chose (docs/reproductions)
    assert feddrop.Config().rescale is True
    a = _run(fed, feddrop.Config(fc_rate=0.5), _mlp([16]))
    b = _run(fed, feddrop.Config(fc_rate=0.5, rescale=True), _mlp([16]))
    assert all(torch.equal(a.final_params[k], b.final_params[k]) for k in a.final_params)
    c = _run(fed, feddrop.Config(fc_rate=0.5, rescale=False), _mlp([16]))
    assert any(not torch.equal(a.final_params[k], c.final_params[k]) for k in a.final_params)
