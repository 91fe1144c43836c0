"""AFD against the spec (specs/fedsparse-fedbiad.md §2.5, single-model): the score update and
resampling on a scripted loss sequence, exact per-layer counts, the loss carried as a counted
Meta entry, sub-model accounting, and the reduction to FedAvg with no dropout."""

from __future__ import annotations

import polars as pl
import pytest
import torch
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import afd, build_algorithm, fedavg
from fedcomm.algorithms.core import AlgorithmConfig, ClientContext, RoundContext, Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.submodel.codec import UNIT, encode_kept, keep_masks
from fedcomm.algorithms.submodel.units import keep_counts, unit_layers
from fedcomm.comm.codecs import build_compressor
from fedcomm.comm.payload import Free, Mask, Meta
from fedcomm.models import build_model
from fedcomm.seeding import Stream, torch_generator
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


def _bits(frame: pl.DataFrame, direction: str) -> set[tuple[int, int, int]]:
    rows = frame.filter(pl.col("direction") == direction)
    return set(rows.select("payload_bits", "index_bits", "meta_bits").iter_rows())


def test_keep_counts_are_one_minus_p_per_hidden_layer_and_output_full() -> None:
    layers = unit_layers(_mlp([40, 20]))
    assert keep_counts(layers, 0.2) == {"fc1": 32, "fc2": 16, "fc3": 10}
    assert keep_counts(layers, 0.0) == {"fc1": 40, "fc2": 20, "fc3": 10}


def test_weighted_selection_by_hand() -> None:
    g = torch.Generator().manual_seed(0)
    scores = torch.tensor([0.0, 0.5, 0.0, 0.25, 0.0])
    for _ in range(20):  # both positive units always, the third uniformly from the zeros
        keep = afd.weighted_selection(scores, 3, g)
        assert int(keep.sum()) == 3 and bool(keep[1]) and bool(keep[3])
    only = afd.weighted_selection(torch.tensor([0.0, 1.0, 0.0, 0.0]), 1, g)
    assert only.tolist() == [False, True, False, False]
    # score-proportional: unit 0 with score 3 against unit 1 with score 1 -> about 3/4
    hits = sum(bool(afd.weighted_selection(torch.tensor([3.0, 1.0]), 1, g)[0]) for _ in range(2000))
    assert 0.70 < hits / 2000 < 0.80
    zeros = afd.weighted_selection(torch.zeros(6), 4, g)  # no scores: uniform, exact count
    assert int(zeros.sum()) == 4


def test_resampling_keeps_exact_per_layer_counts() -> None:
    layers = unit_layers(_mlp([40, 20]))
    counts = keep_counts(layers, 0.3)
    for seed in range(25):
        g = torch.Generator().manual_seed(seed)
        scores = {s.name: torch.rand(s.count, generator=g) for s in layers}
        for s in layers:  # some layers with few, some with many positive scores
            scores[s.name][torch.rand(s.count, generator=g) < seed / 25] = 0.0
        keep = afd.sample_keep(layers, scores, counts, g)
        assert {k: int(m.sum()) for k, m in keep.items()} == counts
    assert keep["fc3"].all()  # output layer full


def test_score_update_and_resampling_on_a_scripted_loss_sequence() -> None:
    layers = unit_layers(_mlp([6]))  # fc1: 6 units, fc2: 10 (output)
    counts = keep_counts(layers, 0.5)  # fc1 keeps 3
    g = torch.Generator().manual_seed(0)
    scores = {s.name: torch.zeros(s.count) for s in layers}
    keep = afd.sample_keep(layers, scores, counts, g)
    first = keep["fc1"].clone()

    # round 1: no ℓ_0 -> nothing changes
    keep, scores, resampled = afd.next_submodel(layers, keep, scores, None, 2.0, counts, g)
    assert not resampled and torch.equal(keep["fc1"], first) and not scores["fc1"].any()

    # round 2: 2.0 -> 1.5 fell: kept units score (2.0 - 1.5) / 2.0 = 0.25; sub-model reused
    keep, scores, resampled = afd.next_submodel(layers, keep, scores, 2.0, 1.5, counts, g)
    assert not resampled and torch.equal(keep["fc1"], first)
    assert scores["fc1"].tolist() == [0.25 if k else 0.0 for k in first.tolist()]

    # round 3: 1.5 -> 1.5 did not fall: resample; the 3 scored units are exactly the 3 to keep
    keep, scores, resampled = afd.next_submodel(layers, keep, scores, 1.5, 1.5, counts, g)
    assert resampled and torch.equal(keep["fc1"], first)
    assert scores["fc1"].tolist() == [0.25 if k else 0.0 for k in first.tolist()]

    # a scored map wider than the keep count: resampling draws only among the scored units
    scores = {"fc1": torch.tensor([0.1, 0.0, 0.3, 0.2, 0.0, 0.4]), "fc2": torch.zeros(10)}
    keep, new_scores, resampled = afd.next_submodel(layers, keep, scores, 1.0, 1.2, counts, g)
    assert resampled and int(keep["fc1"].sum()) == 3
    assert not keep["fc1"][1] and not keep["fc1"][4]
    assert all(torch.equal(new_scores[k], scores[k]) for k in scores)  # scores only set on a fall

    # a fall overwrites only the kept units' scores: 1.2 -> 0.9 gives 0.25
    keep2, scores2, resampled = afd.next_submodel(layers, keep, new_scores, 1.2, 0.9, counts, g)
    assert not resampled and torch.equal(keep2["fc1"], keep["fc1"])
    want = torch.where(keep["fc1"], torch.tensor(0.3 / 1.2), scores["fc1"])
    torch.testing.assert_close(scores2["fc1"], want)


def test_server_update_uses_the_uploaded_losses_and_the_shared_stream(
    fed: FederatedTensors,
) -> None:
    model = _mlp([8])
    alg = build_algorithm(afd.Config(p=0.5))
    state = alg.init_server(_params(model), RoundContext(0, torch.Generator(), 3, model))
    layers = unit_layers(model)
    uniform = afd.sample_keep(
        layers,
        {s.name: torch.zeros(s.count) for s in layers},
        keep_counts(layers, 0.5),
        torch_generator(3, Stream.ALGORITHM, 0),
    )
    assert torch.equal(state.keep["fc1"], uniform["fc1"])  # round 1: uniform, replayable

    def round_(state: afd.ServerState, r: int, losses: list[float]) -> afd.ServerState:
        rctx = RoundContext(r, torch.Generator(), 3, model)
        down = alg.broadcast(state, 0, None, rctx)
        zero = encode_kept(
            {k: torch.zeros_like(v) for k, v in state.params.items()},
            keep_masks(down.decode()),
        )
        ups = [  # weights 1 and 3
            Uplink(i, n, {**{k: e.decode() for k, e in zero.items()}, afd.LOSS: torch.tensor(lo)})
            for i, (n, lo) in enumerate(zip([1, 3], losses, strict=True))
        ]
        new: afd.ServerState = alg.server_update(state, ups, rctx)
        return new

    s1 = round_(state, 1, [4.0, 2.0])
    assert s1.prev_loss == pytest.approx(2.5) and s1.resampled == 0.0  # (4 + 3·2) / 4
    assert torch.equal(s1.keep["fc1"], state.keep["fc1"])
    s2 = round_(s1, 2, [2.0, 2.0])  # 2.5 -> 2.0: kept units score 0.2
    assert s2.resampled == 0.0 and torch.equal(s2.keep["fc1"], state.keep["fc1"])
    torch.testing.assert_close(s2.scores["fc1"], state.keep["fc1"] * 0.2)
    s3 = round_(s2, 3, [3.0, 3.0])  # no fall: resample from (seed, ALGORITHM, round)
    assert s3.resampled == 1.0 and s3.prev_loss == pytest.approx(3.0)
    want, _, _ = afd.next_submodel(
        layers,
        s2.keep,
        s2.scores,
        2.0,
        3.0,
        keep_counts(layers, 0.5),
        torch_generator(3, Stream.ALGORITHM, 3),
    )
    assert all(torch.equal(s3.keep[k], want[k]) for k in want)
    assert alg.server_metrics(s3) == {"afd/resampled": 1.0, "afd/round_loss": pytest.approx(3.0)}


def test_bits_sub_model_entries_plus_loss_meta_and_optional_pattern(
    fed: FederatedTensors,
) -> None:
    # mlp 64-4-2-10, p = 0.5: fc1 keeps 2 of 4 rows (2·64 + 2), fc2 1 of 2 rows reading the 2
    # kept fc1 units (1·2 + 1), fc3 all 10 rows reading the kept fc2 unit (10·1 + 10):
    # 153 entries -> 32·153 = 4896 bits each way; up + 32 meta bits for the loss
    free = _run(fed, afd.Config(p=0.5), _mlp([4, 2]), rounds=1).ledger.frame()
    assert _bits(free, "down") == {(4896, 0, 0)}
    assert _bits(free, "up") == {(4896, 0, 32)}
    # count_pattern: + 1 bit per hidden unit (4 + 2) in the downlink
    counted = _run(fed, afd.Config(p=0.5, count_pattern=True), _mlp([4, 2]), 1).ledger.frame()
    assert _bits(counted, "down") == {(4896 + 6, 0, 0)}
    assert _bits(counted, "up") == {(4896, 0, 32)}

    model = _mlp([4, 2])
    rctx = RoundContext(1, torch.Generator(), 0, model)
    for flag, entry in ((False, Free), (True, Mask)):
        alg = build_algorithm(afd.Config(p=0.5, count_pattern=flag))
        down = alg.broadcast(alg.init_server(_params(model), rctx), 0, None, rctx)
        assert {k for k in down if k.startswith(UNIT)} == {"unit/fc1", "unit/fc2"}
        assert isinstance(down["unit/fc1"], entry)


def test_uplink_carries_the_mean_training_loss(fed: FederatedTensors) -> None:
    model = _mlp([16])
    alg = build_algorithm(afd.Config())
    rctx = RoundContext(1, torch.Generator(), 0, model)
    down = alg.broadcast(alg.init_server(_params(model), rctx), 2, None, rctx).decode()
    cctx = ClientContext(1, 2, model, LocalConfig(steps=3), torch.Generator().manual_seed(0))
    res = alg.client_update(down, None, fed.train[2], cctx)
    assert isinstance(res.uplink[afd.LOSS], Meta)
    assert float(res.uplink[afd.LOSS].decode()) == pytest.approx(res.metrics["train/loss"])
    assert res.metrics["afd/submodel_fraction"] < 1.0
    assert alg.uploaded_model is not None
    rebuilt = alg.uploaded_model(down, res.uplink.decode())
    for k, v in res.local_params.items():
        torch.testing.assert_close(rebuilt[k], v)


def test_no_dropout_equals_fedavg(fed: FederatedTensors) -> None:
    drop = _run(fed, afd.Config(p=0.0), _mlp([16]), rounds=3)
    avg = _run(fed, fedavg.Config(weighting="num_examples"), _mlp([16]), rounds=3)
    assert all(torch.equal(drop.final_params[k], avg.final_params[k]) for k in avg.final_params)
    for a, b in zip(drop.state.round_rows, avg.state.round_rows, strict=True):
        assert a["global/accuracy"] == b["global/accuracy"]
        assert a["local/accuracy"] == b["local/accuracy"]
        assert a["afd/submodel_fraction"] == 1.0
    d, f = drop.ledger.frame(), avg.ledger.frame()
    assert d["payload_bits"].to_list() == f["payload_bits"].to_list()
    assert set(d.filter(pl.col("direction") == "up")["meta_bits"].to_list()) == {32}
