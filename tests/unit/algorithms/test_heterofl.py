"""HeteroFL against the spec (specs/fedsparse-fedbiad.md §2.5): the first ceil(r·C) units of
every hidden layer (output layer full), 32 bits per sub-model entry both ways, per-entry count
averaging with unheld entries untouched, the scaler, label masking, and rate 1 = FedAvg."""

from __future__ import annotations

from typing import Literal

import pytest
import torch
from pydantic import ValidationError
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import build_algorithm, fedavg, heterofl
from fedcomm.algorithms.core import AlgorithmConfig, ClientContext, RoundContext, Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.submodel.codec import decode_kept, encode_kept, keep_masks
from fedcomm.algorithms.submodel.units import first_units, slice_masks, unit_layers, width_units
from fedcomm.comm.codecs import build_compressor
from fedcomm.comm.payload import Payload
from fedcomm.models import build_model
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _mlp(hidden: list[int]) -> nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=hidden)


def _params(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _run(
    fed: FederatedTensors, cfg: AlgorithmConfig, model: nn.Module, rounds: int = 2
) -> loop.RunResult:
    lc = loop.LoopConfig(
        rounds=rounds, clients_per_round=3, local=LocalConfig(steps=4, batch_size=16), seed=7
    )
    return loop.run(lc, build_algorithm(cfg), model, fed, build_compressor("none"), config_hash="t")


def test_width_is_a_robust_ceiling() -> None:
    assert width_units(0.7, 10) == 7  # 0.7·10 = 7.000000000000001 in floating point
    assert width_units(0.5, 3) == 2
    assert width_units(0.8, 16) == 13
    assert width_units(0.01, 4) == 1  # at least one unit
    assert width_units(1.0, 5) == 5


def test_slice_is_the_first_units_and_the_output_layer_stays_full() -> None:
    model = _mlp([4, 6])
    params = _params(model)
    layers = unit_layers(model, "heterofl")
    keep = first_units(layers, 0.5)
    assert {k: m.tolist() for k, m in keep.items()} == {
        "fc1": [True, True, False, False],
        "fc2": [True, True, True, False, False, False],
        "fc3": [True] * 10,
    }
    m = slice_masks(layers, 0.5, params)
    want = {
        "fc1.weight": (slice(0, 2), slice(0, 64)),
        "fc2.weight": (slice(0, 3), slice(0, 2)),
        "fc3.weight": (slice(0, 10), slice(0, 3)),
    }
    for name, (r, c) in want.items():
        expect = torch.zeros_like(m[name])
        expect[r, c] = True
        assert torch.equal(m[name], expect), name
    assert m["fc1.bias"].tolist() == [True, True, False, False]
    assert m["fc2.bias"].tolist() == [True] * 3 + [False] * 3
    assert bool(m["fc3.bias"].all())


def test_conv_slice_reads_the_first_channels_through_the_flatten() -> None:
    torch.manual_seed(0)
    model = build_model("cnn", input_shape=(3, 32, 32), num_classes=10, channels=[4, 6], hidden=8)
    params = _params(model)
    m = slice_masks(unit_layers(model, "heterofl"), 0.5, params)
    assert int(m["conv1.weight"].sum()) == 2 * 3 * 25 and m["conv1.weight"][:2].all()
    assert m["conv2.weight"][:3, :2].all() and int(m["conv2.weight"].sum()) == 3 * 2 * 25
    assert m["fc1.weight"][:4, :75].all() and int(m["fc1.weight"].sum()) == 4 * 75
    assert m["fc2.weight"][:, :4].all() and int(m["fc2.weight"].sum()) == 40
    # the masked network is the smaller dense network of the first units
    small = build_model("cnn", input_shape=(3, 32, 32), num_classes=10, channels=[2, 3], hidden=4)
    sub = {
        "conv1.weight": params["conv1.weight"][:2],
        "conv1.bias": params["conv1.bias"][:2],
        "conv2.weight": params["conv2.weight"][:3, :2],
        "conv2.bias": params["conv2.bias"][:3],
        "fc1.weight": params["fc1.weight"][:4, :75],
        "fc1.bias": params["fc1.bias"][:4],
        "fc2.weight": params["fc2.weight"][:, :4],
        "fc2.bias": params["fc2.bias"],
    }
    x = torch.randn(3, 3, 32, 32)
    want = torch.func.functional_call(small, sub, (x,))
    got = torch.func.functional_call(model, {k: v * m[k] for k, v in params.items()}, (x,))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_ledger_counts_32_bits_per_sub_model_entry_each_way(fed: FederatedTensors) -> None:
    # mlp 64-4-2-10 at r = 0.5: fc1 keeps rows 0-1 (2·64 + 2), fc2 row 0 reading them (2 + 1),
    # fc3 all 10 rows reading fc2's unit 0 (10 + 10): 130 + 3 + 20 = 153 entries = 4896 bits
    res = _run(fed, heterofl.Config(rate=0.5), _mlp([4, 2]), rounds=1)
    frame = res.ledger.frame()
    assert frame.height == 6  # 3 clients, down + up
    assert set(frame["payload_bits"].to_list()) == {4896}
    assert set(frame["index_bits"].to_list()) | set(frame["meta_bits"].to_list()) == {0}


def test_rate_one_equals_fedavg_with_count_weighting(fed: FederatedTensors) -> None:
    het = _run(fed, heterofl.Config(rate=1.0), _mlp([16]))
    avg = _run(fed, fedavg.Config(weighting="uniform"), _mlp([16]))
    assert all(torch.equal(het.final_params[k], avg.final_params[k]) for k in avg.final_params)
    assert het.ledger.rows == avg.ledger.rows
    for a, b in zip(het.state.round_rows, avg.state.round_rows, strict=True):
        assert a["global/accuracy"] == b["global/accuracy"]
        assert a["local/accuracy"] == b["local/accuracy"]


def _uplink(cid: int, n: int, delta: dict[str, Tensor], keep: dict[str, Tensor]) -> Uplink:
    return Uplink(cid, n, Payload(encode_kept(delta, keep)).decode())


@pytest.mark.parametrize(("weighting", "entry0"), [("count", 2.0), ("num_examples", 2.5)])
def test_server_averages_per_entry_over_holders_and_keeps_unheld(
    weighting: Literal["count", "num_examples"], entry0: float
) -> None:
    model = _mlp([4])
    alg = build_algorithm(heterofl.Config(rate=0.5, weighting=weighting))
    params = _params(model)
    rctx = RoundContext(1, torch.Generator(), 0, model)
    state = alg.init_server(params, rctx)
    layers = unit_layers(model, "heterofl")
    half = slice_masks(layers, 0.5, params)
    quarter = slice_masks(layers, 0.25, params)
    ones = {k: torch.ones_like(v) for k, v in params.items()}
    ups = [_uplink(0, 1, ones, half), _uplink(1, 3, {k: 3 * v for k, v in ones.items()}, quarter)]
    new = alg.server_update(state, ups, rctx).params
    diff = {k: new[k] - params[k] for k in params}
    # fc1 row 0 held by both: (1 + 3)/2 = 2 by count, (1·1 + 3·3)/4 = 2.5 by examples;
    # fc1 row 1 only by client 0: 1; rows 2-3 by nobody: unchanged
    torch.testing.assert_close(diff["fc1.bias"], torch.tensor([entry0, 1.0, 0.0, 0.0]))
    assert torch.equal(new["fc1.weight"][2:], params["fc1.weight"][2:])
    assert torch.equal(new["fc2.weight"][:, 2:], params["fc2.weight"][:, 2:])
    torch.testing.assert_close(diff["fc2.weight"][:, 1], torch.ones(10))


def test_training_keeps_the_slice_and_unheld_entries_stay_untouched(
    fed: FederatedTensors,
) -> None:
    model = _mlp([16])
    alg = build_algorithm(heterofl.Config(rate=0.5))
    rctx = RoundContext(1, torch.Generator(), 1, model)
    state = alg.init_server(_params(model), rctx)
    down = alg.broadcast(state, 0, None, rctx).decode()
    keep = keep_masks(down)
    assert int(keep["fc1.bias"].sum()) == 8 and bool(keep["fc1.bias"][:8].all())
    cctx = ClientContext(1, 0, model, LocalConfig(lr=0.1, momentum=0.9), torch.Generator())
    res = alg.client_update(down, None, fed.train[0], cctx)
    for k, m in keep.items():
        assert torch.equal(res.local_params[k][~m], torch.zeros(int((~m).sum())))
    assert alg.uploaded_model is not None
    rebuilt = alg.uploaded_model(down, res.uplink.decode())
    for k, v in res.local_params.items():
        torch.testing.assert_close(rebuilt[k], v)
    new = alg.server_update(state, [Uplink(0, res.num_examples, res.uplink.decode())], rctx)
    for k, m in keep.items():
        assert torch.equal(new.params[k][~m], state.params[k][~m])
        assert (new.params[k][m] != state.params[k][m]).any()


def test_scaler_divides_each_hidden_output_by_the_rate() -> None:
    model = _mlp([5, 3])
    params = _params(model)
    layers = unit_layers(model, "heterofl")
    x = torch.randn(4, 1, 8, 8)
    scaled = heterofl.scaler_map(layers, 0.5)(dict(params))
    got = torch.func.functional_call(model, scaled, (x,))
    h = torch.relu((x.flatten(1) @ params["fc1.weight"].T + params["fc1.bias"]) / 0.5)
    h = torch.relu((h @ params["fc2.weight"].T + params["fc2.bias"]) / 0.5)
    want = h @ params["fc3.weight"].T + params["fc3.bias"]  # output layer not scaled
    torch.testing.assert_close(got, want)
    assert scaled["fc3.weight"] is params["fc3.weight"]


def test_scaler_changes_training_but_not_the_message_format(fed: FederatedTensors) -> None:
    model = _mlp([16])
    out = {}
    for scaler in (True, False):
        alg = build_algorithm(heterofl.Config(rate=0.5, scaler=scaler))
        rctx = RoundContext(1, torch.Generator(), 0, model)
        down = alg.broadcast(alg.init_server(_params(model), rctx), 0, None, rctx).decode()
        cctx = ClientContext(1, 0, model, LocalConfig(), torch.Generator().manual_seed(0))
        out[scaler] = alg.client_update(down, None, fed.train[0], cctx).local_params
    assert not torch.equal(out[True]["fc1.weight"], out[False]["fc1.weight"])


def test_mask_labels_zeroes_absent_logits_and_freezes_their_rows(fed: FederatedTensors) -> None:
    model = _mlp([8])
    params = _params(model)
    layers = unit_layers(model, "heterofl")
    fmap = heterofl.label_mask_map(layers, torch.tensor([1, 3, 3]), params)
    logits = torch.func.functional_call(model, fmap(dict(params)), (torch.randn(2, 1, 8, 8),))
    absent = torch.ones(10, dtype=torch.bool)
    absent[[1, 3]] = False
    assert torch.equal(logits[:, absent], torch.zeros(2, 8))
    assert (logits[:, [1, 3]] != 0).all()

    data = fed.train[0]
    keep = torch.isin(data.y, torch.tensor([0, 1, 2]))
    data = type(data)(data.x[keep], data.y[keep])  # a client with labels {0, 1, 2} only
    alg = build_algorithm(heterofl.Config(rate=0.5, mask_labels=True))
    rctx = RoundContext(1, torch.Generator(), 0, model)
    down = alg.broadcast(alg.init_server(params, rctx), 0, None, rctx).decode()
    cctx = ClientContext(1, 0, model, LocalConfig(), torch.Generator().manual_seed(0))
    res = alg.client_update(down, None, data, cctx)
    sub = decode_kept(down)
    for name in ("fc2.weight", "fc2.bias"):
        assert torch.equal(res.local_params[name][3:], sub[name][3:])
        assert not torch.equal(res.local_params[name][:3], sub[name][:3])


def test_config_is_validated() -> None:
    for bad in ({"rate": 0.0}, {"rate": 1.5}, {"weighting": "uniform"}):
        with pytest.raises(ValidationError):
            heterofl.Config(**bad)


@pytest.mark.parametrize(
    ("name", "shape", "options"),
    [("resnet20", (3, 32, 32), {}), ("lstm", (5,), {"embed_dim": 4, "hidden": 4})],
)
def test_validate_model_rejects_residual_and_recurrent_models(
    name: str, shape: tuple[int, ...], options: dict[str, int]
) -> None:
    alg = build_algorithm(heterofl.Config())
    assert alg.validate_model is not None
    for ok in ("mlp", "mnist_cnn"):
        alg.validate_model(build_model(ok, input_shape=(1, 8, 8), num_classes=10))
    with pytest.raises(ValueError, match="heterofl supports the sequential models"):
        alg.validate_model(build_model(name, input_shape=shape, num_classes=10, **options))
