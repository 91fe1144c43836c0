"""FjORD against the spec (specs/fedsparse-fedbiad.md §2.5): per-batch widths drawn only from
the levels up to q_max (replayable), q_max slice up and down at 32 bits per entry, nested
aggregation by hand, entries outside every slice untouched, and q_max = 1 = FedAvg."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from pydantic import ValidationError
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import build_algorithm, fedavg, fjord
from fedcomm.algorithms.core import AlgorithmConfig, ClientContext, RoundContext, Uplink
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.submodel.codec import decode_kept, keep_masks
from fedcomm.algorithms.submodel.merge import nested_aggregate
from fedcomm.algorithms.submodel.units import slice_masks, unit_layers
from fedcomm.comm.codecs import build_compressor
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


def test_widths_come_only_from_levels_up_to_q_max_and_replay() -> None:
    levels = [0.2, 0.4, 0.6, 0.8, 1.0]
    assert fjord.allowed_levels(levels, 0.6) == [0.2, 0.4, 0.6]
    drawn = fjord.sample_widths(levels, 0.6, 300, torch.Generator().manual_seed(3))
    assert set(drawn) == {0.2, 0.4, 0.6}
    assert drawn == fjord.sample_widths(levels, 0.6, 300, torch.Generator().manual_seed(3))
    assert drawn != fjord.sample_widths(levels, 0.6, 300, torch.Generator().manual_seed(4))
    assert set(fjord.sample_widths([1.0], 1.0, 5, torch.Generator())) == {1.0}


def test_client_draws_its_widths_after_its_batches_from_its_generator(
    fed: FederatedTensors,
) -> None:
    model = _mlp([10])
    cfg = fjord.Config(q_max=0.5, levels=[0.2, 0.5, 1.0])
    alg = build_algorithm(cfg)
    rctx = RoundContext(1, torch.Generator(), 0, model)
    state = alg.init_server(_params(model), rctx)
    down = alg.broadcast(state, 0, None, rctx).decode()
    local = LocalConfig(steps=12, batch_size=8)
    data = fed.train[0]
    cctx = ClientContext(1, 0, model, local, torch.Generator().manual_seed(11))
    res = alg.client_update(down, None, data, cctx)
    g = torch.Generator().manual_seed(11)  # replay: the batch schedule, then the widths
    batches = _local.batch_schedule(data.num_examples, local, g)
    widths = fjord.sample_widths(cfg.levels, cfg.q_max, len(batches), g)
    assert set(widths) == {0.2, 0.5}
    assert res.metrics["fjord/mean_width"] == pytest.approx(sum(widths) / len(widths))
    # replaying the steps with the q sub-model of each batch gives the client's model exactly
    layers = unit_layers(model, "fjord")
    sub = decode_kept(down)
    live = {k: v.clone() for k, v in sub.items()}
    for idx, q in zip(batches, widths, strict=True):
        mask = slice_masks(layers, q, sub)
        live = {k: v.detach().requires_grad_(True) for k, v in live.items()}
        out = torch.func.functional_call(
            model, {k: v * mask[k] for k, v in live.items()}, (data.x[idx],)
        )
        loss = torch.nn.functional.cross_entropy(out, data.y[idx])
        grads = torch.autograd.grad(loss, list(live.values()))
        live = {
            k: (v - local.lr * gr).detach() for (k, v), gr in zip(live.items(), grads, strict=True)
        }
    for k, v in res.local_params.items():
        torch.testing.assert_close(v, live[k])
    # the 0.5 slice (5 of 10 units) is uploaded; units 2-4 only trained on 0.5-batches
    keep = keep_masks(down)
    assert keep["fc1.bias"].tolist() == [True] * 5 + [False] * 5
    assert torch.equal(res.local_params["fc1.weight"][5:], torch.zeros(5, 64))
    assert not torch.equal(res.local_params["fc1.weight"][2:5], sub["fc1.weight"][2:5])


def test_ledger_counts_32_bits_per_q_max_entry_each_way(fed: FederatedTensors) -> None:
    # mlp 64-4-2-10 at q_max = 0.5: 2·64 + 2, then 1·2 + 1, then 10·1 + 10 = 153 entries
    res = _run(fed, fjord.Config(q_max=0.5, levels=[0.25, 0.5, 1.0]), _mlp([4, 2]), rounds=1)
    frame = res.ledger.frame()
    assert frame.height == 6
    assert set(frame["payload_bits"].to_list()) == {4896}
    assert set(frame["index_bits"].to_list()) | set(frame["meta_bits"].to_list()) == {0}


def test_full_width_equals_fedavg(fed: FederatedTensors) -> None:
    fj = _run(fed, fjord.Config(q_max=1.0, levels=[1.0]), _mlp([16]))
    avg = _run(fed, fedavg.Config(weighting="num_examples"), _mlp([16]))
    assert all(torch.equal(fj.final_params[k], avg.final_params[k]) for k in avg.final_params)
    assert fj.ledger.rows == avg.ledger.rows
    for a, b in zip(fj.state.round_rows, avg.state.round_rows, strict=True):
        assert a["global/accuracy"] == b["global/accuracy"]
        assert a["local/accuracy"] == b["local/accuracy"]


def test_nested_aggregation_by_hand() -> None:
    t, f = True, False
    levels = [{"w": torch.tensor([t, f, f, f])}, {"w": torch.tensor([t, t, t, f])}]
    masks = [
        {"w": torch.tensor([t, f, f, f])},  # q_max = level 0
        {"w": torch.tensor([t, t, t, f])},  # q_max = level 1
        {"w": torch.tensor([t, t, f, f])},  # part of level 1 only: counts for level 0 alone
    ]
    deltas = [
        {"w": torch.tensor([1.0, 0.0, 0.0, 0.0])},
        {"w": torch.tensor([2.0, 4.0, 6.0, 0.0])},
        {"w": torch.tensor([5.0, 7.0, 0.0, 0.0])},
    ]
    delta, covered = nested_aggregate(deltas, masks, [1.0, 3.0, 1.0], levels)
    # entry 0 (level 0): (1·1 + 3·2 + 1·5)/5; entries 1-2 (level 1): client 1 alone; 3: nobody
    assert delta["w"].tolist() == pytest.approx([12 / 5, 4.0, 6.0, 0.0])
    assert covered["w"].tolist() == [t, t, t, f]
    none_at_top, cov = nested_aggregate(deltas[:1], masks[:1], [2.0], levels)
    assert none_at_top["w"].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert cov["w"].tolist() == [t, f, f, f]


def test_server_leaves_entries_outside_every_slice_untouched(fed: FederatedTensors) -> None:
    model = _mlp([10, 6])
    alg = build_algorithm(fjord.Config(q_max=0.6, levels=[0.2, 0.6, 1.0]))
    state = alg.init_server(_params(model), RoundContext(0, torch.Generator(), 0, model))
    ups = []
    for cid in (0, 1):
        rctx = RoundContext(1, torch.Generator(), 0, model)
        down = alg.broadcast(state, cid, None, rctx).decode()
        cctx = ClientContext(1, cid, model, LocalConfig(), torch.Generator().manual_seed(cid))
        res = alg.client_update(down, None, fed.train[cid], cctx)
        assert alg.uploaded_model is not None
        rebuilt = alg.uploaded_model(down, res.uplink.decode())
        for k, v in res.local_params.items():
            torch.testing.assert_close(rebuilt[k], v)
        ups.append(Uplink(cid, res.num_examples, res.uplink.decode()))
    keep = keep_masks(down)
    assert int(keep["fc1.bias"].sum()) == 6 and int(keep["fc2.bias"].sum()) == 4
    new = alg.server_update(state, ups, RoundContext(1, torch.Generator(), 0, model))
    for k, m in keep.items():
        assert torch.equal(new.params[k][~m], state.params[k][~m])
        assert (new.params[k][m] != state.params[k][m]).any()
    # with one q_max the nested rule is the n_k-weighted mean of the q_max slices
    n = [u.num_examples for u in ups]
    for k, m in keep.items():
        want = sum(n[i] * (decode_kept(ups[i].tensors)[k]) for i in range(2)) / sum(n)
        torch.testing.assert_close(new.params[k][m], (state.params[k] + want)[m])


def test_config_is_validated() -> None:
    assert fjord.Config(levels=[1.0, 0.8, 0.2, 0.8]).levels == [0.2, 0.8, 1.0]
    bad: dict[str, Any]
    for bad in ({"q_max": 0.7}, {"levels": []}, {"levels": [0.0, 0.8]}, {"levels": [0.8, 1.2]}):
        with pytest.raises(ValidationError):
            fjord.Config(**bad)


def test_validate_model_rejects_residual_models() -> None:
    alg = build_algorithm(fjord.Config())
    assert alg.validate_model is not None
    alg.validate_model(build_model("mnist_cnn", input_shape=(1, 8, 8), num_classes=10))
    resnet = build_model("resnet20", input_shape=(3, 32, 32), num_classes=10)
    with pytest.raises(ValueError, match="fjord supports the sequential models"):
        alg.validate_model(resnet)
