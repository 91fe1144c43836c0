"""FedBIAD against the spec (specs/fedsparse-fedbiad.md §2.1-2.4, §2.7): exact per-layer row
counts (MLP and LSTM), the loss trend and Eq. 9 score update on hand numbers, Eq. 13, stage two's
top rows, upload accounting, Eq. 10 vs masked aggregation, and the reduction to FedAvg at p = 0."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import build_algorithm, fedavg
from fedcomm.algorithms.core import AlgorithmConfig, ClientContext, ClientData, RoundContext, Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.fedbiad import algorithm as fedbiad
from fedcomm.algorithms.fedbiad.bayes import kl_weight, model_variance, posterior_variance
from fedcomm.algorithms.fedbiad.rows import (
    is_check_point,
    keep_counts,
    random_pattern,
    row_specs,
    score_update,
    top_rows,
    trend,
)
from fedcomm.algorithms.fedbiad.server import encode_upload
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


def _lstm() -> nn.Module:
    torch.manual_seed(0)
    return build_model(
        "lstm", input_shape=(5,), num_classes=20, embed_dim=8, hidden=8, num_layers=1
    )


def _params(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _client(
    alg_cfg: fedbiad.Config,
    model: nn.Module,
    data: ClientData,
    round_: int = 1,
    state: fedbiad.ClientState | None = None,
    local: LocalConfig | None = None,
    seed: int = 0,
) -> tuple[dict[str, Tensor], object]:
    alg = build_algorithm(alg_cfg)
    server = alg.init_server(_params(model), RoundContext(0, torch.Generator(), 0, model))
    down = alg.broadcast(
        server, 0, state or fedbiad.ClientState(), RoundContext(round_, torch.Generator())
    )
    gen = torch.Generator().manual_seed(seed)
    ctx = ClientContext(round_, 0, model, local or LocalConfig(steps=8, batch_size=8), gen)
    res = alg.client_update(down.decode(), state or fedbiad.ClientState(), data, ctx)
    return down.decode(), res


# --- p = 0 is FedAvg -------------------------------------------------------------------------


def _run(fed: FederatedTensors, cfg: AlgorithmConfig, rounds: int = 2) -> loop.RunResult:
    lc = loop.LoopConfig(
        rounds=rounds,
        clients_per_round=3,
        local=LocalConfig(epochs=1, batch_size=16, lr=0.05),
        seed=7,
    )
    model = _mlp([16])
    return loop.run(lc, build_algorithm(cfg), model, fed, build_compressor("none"), config_hash="t")


@pytest.mark.parametrize(
    ("aggregation", "stage_boundary"), [("masked", 55), ("eq10", 55), ("eq10", 0)]
)
def test_p_zero_without_kl_is_fedavg(
    fed: FederatedTensors, aggregation: str, stage_boundary: int
) -> None:
    # p = 0 keeps every row; with kl off the local objective is the plain CE. The only difference
    # left is the s̃ε noise of Eq. 13 (s̃ ≈ 1e-8 here), so the models agree to fp32 round-off.
    avg = _run(fed, fedavg.Config(weighting="num_examples"))
    biad = _run(
        fed,
        fedbiad.Config(p=0.0, kl=False, aggregation=aggregation, stage_boundary=stage_boundary),  # type: ignore[arg-type]
    )
    for k, w in avg.final_params.items():
        torch.testing.assert_close(biad.final_params[k], w, rtol=1e-5, atol=1e-6)
    assert {r["fedbiad/kept_fraction"] for r in biad.state.round_rows} == {1.0}


# --- rows and patterns -----------------------------------------------------------------------


def test_kept_rows_are_exact_per_layer_mlp_and_lstm() -> None:
    mlp = row_specs(_mlp([40, 20]), drop_output_layer=True)
    assert keep_counts(mlp, 0.2) == {"fc1": 32, "fc2": 16, "fc3": 8}
    assert keep_counts(mlp, 0.3) == {"fc1": 28, "fc2": 14, "fc3": 7}  # 0.7·10 -> 7, not 8
    assert keep_counts(mlp, 0.25) == {"fc1": 30, "fc2": 15, "fc3": 8}  # ceil(7.5)
    no_out = row_specs(_mlp([40, 20]), drop_output_layer=False)
    assert [s.name for s in no_out] == ["fc1", "fc2"]

    lstm = row_specs(_lstm(), drop_output_layer=True, lstm_rows="both")
    assert [(s.name, s.count) for s in lstm] == [
        ("embedding", 8),
        ("lstm.weight_ih_l0", 32),
        ("lstm.weight_hh_l0", 32),
        ("decoder", 20),
    ]
    want = {"embedding": 7, "lstm.weight_ih_l0": 26, "lstm.weight_hh_l0": 26, "decoder": 16}
    assert keep_counts(lstm, 0.2) == want  # ceil(6.4), ceil(25.6), ceil(25.6), 16
    for seed in range(5):
        beta = random_pattern(lstm, 0.2, torch.Generator().manual_seed(seed))
        assert {k: int(b.sum()) for k, b in beta.items()} == want
    glob = random_pattern(lstm, 0.2, torch.Generator().manual_seed(0), scope="global")
    assert sum(int(b.sum()) for b in glob.values()) == math.ceil(0.8 * 92 - 1e-9)  # 74 of J = 92


def test_lstm_client_keeps_exact_rows_and_zeroes_the_dropped_ones() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 20, (24, 5), generator=g)
    data = ClientData(x, torch.roll(x, -1, dims=1))
    model = _lstm()
    _, res = _client(fedbiad.Config(p=0.5, lstm_rows="both"), model, data)
    up = res.uplink.decode()  # type: ignore[attr-defined]
    counts = {k.removeprefix("mask/"): int(v.sum()) for k, v in up.items() if k.startswith("mask/")}
    assert counts == {
        "embedding": 4,
        "lstm.weight_ih_l0": 16,
        "lstm.weight_hh_l0": 16,
        "decoder": 10,
    }
    local = res.local_params  # type: ignore[attr-defined]
    dropped = ~up["mask/embedding"]
    assert not local["embedding.weight"][:, dropped].any()  # an embedding row is a column
    assert local["embedding.weight"][:, ~dropped].all()
    assert not local["lstm.bias_hh_l0"][~up["mask/lstm.weight_hh_l0"]].any()
    # 32 bits per kept entry + 1 bit per row (J = 92)
    kept = 4 * 20 + 16 * (8 + 1) * 2 + 10 * (8 + 1)
    assert res.uplink.nbits().total == 32 * kept + 92  # type: ignore[attr-defined]


# --- Eq. 8 / Eq. 9 ---------------------------------------------------------------------------


def test_check_points_trend_and_score_update_by_hand() -> None:
    assert [v for v in range(12) if is_check_point(v, 3)] == [6, 9]
    assert [v for v in range(8) if is_check_point(v, 2)] == [4, 6]
    # τ = 2: ΔL = mean(0.95, 1.1) − mean(1.0, 0.9) = 1.025 − 0.95 = 0.075 > 0
    assert trend([5.0, 1.0, 0.9, 0.95, 1.1], 2) == pytest.approx(0.075)
    now, nxt = torch.tensor([1, 1, 0, 1]).bool(), torch.tensor([1, 0, 1, 0]).bool()
    e = torch.tensor([0.0, 2.0, 5.0, 1.0])
    # rising loss: a held row gains 1[β^{v+1}_j = 1]; rows not held (j = 2) never change
    got = score_update([1.0, 0.9, 0.95, 1.1], now, nxt, e)
    assert got.tolist() == [1.0, 2.0, 5.0, 1.0]
    # falling (ΔL = 0.75 − 0.95 = −0.2) and flat (ΔL = 0) losses: every held row gains 1
    assert score_update([1.0, 0.9, 0.8, 0.7], now, nxt, e).tolist() == [1, 3, 5, 2]
    assert score_update([1.0, 1.0, 1.0, 1.0], now, nxt, e).tolist() == [1, 3, 5, 2]
    assert e.tolist() == [0.0, 2.0, 5.0, 1.0]  # pure
    with pytest.raises(ValueError, match="2τ"):
        trend([1.0, 2.0, 3.0], 2)


def test_scores_on_a_scripted_loss_sequence() -> None:
    # V = 9 iterations, τ = 2: check points v = 4, 6, 8 with windows ℓ_1..4, ℓ_3..6, ℓ_5..8
    losses = [9.0, 4.0, 3.0, 2.0, 1.0, 1.5, 2.5, 2.0, 1.0]
    b0, b1 = torch.tensor([1, 1, 0]).bool(), torch.tensor([0, 1, 1]).bool()
    e = torch.zeros(3)
    # v = 4: ℓ3+ℓ4 vs ℓ1+ℓ2: (2+1)/2 − (4+3)/2 = −2 ≤ 0 -> keep β0, held rows +1   -> [1, 1, 0]
    e = score_update(losses[1:5], b0, b0, e)
    # v = 6: (1.5+2.5)/2 − (2+1)/2 = 0.5 > 0 -> resampled to β1, held rows gain β1 -> [1, 2, 0]
    e = score_update(losses[3:7], b0, b1, e)
    # v = 8: (2+1)/2 − (1.5+2.5)/2 = −0.5 ≤ 0 -> β1 kept, rows 1, 2 gain 1         -> [1, 3, 1]
    e = score_update(losses[5:9], b1, b1, e)
    assert e.tolist() == [1.0, 3.0, 1.0]


def test_client_scores_persist_and_count_check_points(fed: FederatedTensors) -> None:
    cfg = fedbiad.Config(p=0.5, tau=2)
    _, res = _client(cfg, _mlp([8]), fed.train[0], local=LocalConfig(steps=9, batch_size=8))
    state = res.state  # type: ignore[attr-defined]
    total = sum(float(s.sum()) for s in state.scores.values())
    # 3 check points (v = 4, 6, 8); each adds at most one point per held row (4 + 5 rows)
    assert 0 < total <= 3 * 9
    m = res.metrics  # type: ignore[attr-defined]
    assert 0 <= m["fedbiad/resamples"] <= 3 and m["fedbiad/kept_fraction"] == 9 / 18
    assert 0 < m["fedbiad/s2"] < 1e-12 and m["fedbiad/stage"] == 1.0
    _, again = _client(
        cfg, _mlp([8]), fed.train[0], state=state, local=LocalConfig(steps=9, batch_size=8)
    )
    total2 = sum(float(s.sum()) for s in again.state.scores.values())  # type: ignore[attr-defined]
    assert total2 >= total  # scores only grow, across rounds


# --- Eq. 13 ----------------------------------------------------------------------------------


def test_posterior_variance_eq13_on_mnist_sizes() -> None:
    # The paper's MNIST MLP 784-128-10: d = 784, D = 128, L = 2, B = 2, p = 0.2, J = 138 rows
    # (S = 0.8·138·128 = 14131.2), one round (r = 1) of V = 20 iterations, min |D_k| = 50.
    s2 = posterior_variance(S=0.8 * 138 * 128, m=1 * 20 * 50, d=784, D=128, L=2, B=2)
    bd = 2 * 128
    brace = (784 + 1 + 1 / (bd - 1)) ** 2 + 1 / (bd**2 - 1) + 2 / (bd - 1) ** 2
    want = 0.8 * 138 * 128 / (16 * 1000 * 784**2) / math.log(3 * 128) * (2 * bd) ** -4 / brace
    assert s2 == pytest.approx(want, rel=1e-12)
    assert s2 == pytest.approx(5.70e-24, rel=1e-2)
    # At the last round (r = 60) it is ~1e-25; the spec's "about 1e-28" needs m ≈ 6e7. Either
    # way s̃ ≈ 1e-12 is far below fp32's resolution of weights of size ~1e-2.
    late = posterior_variance(S=0.8 * 138 * 128, m=60 * 20 * 50, d=784, D=128, L=2, B=2)
    assert 1e-30 < late < 1e-24
    assert torch.equal(torch.tensor(0.01) + math.sqrt(late), torch.tensor(0.01))
    # and on the model: the same inputs read off a 784-128-10 MLP
    mlp = build_model("mlp", input_shape=(784,), num_classes=10, hidden=[128])
    got = model_variance(mlp, p=0.2, B=2, d=784, round_=1, steps=20, n=50)
    assert got == pytest.approx(s2, rel=1e-12)


# --- stage two -------------------------------------------------------------------------------


def test_top_rows_picks_highest_scores_and_breaks_ties_at_random() -> None:
    g = torch.Generator().manual_seed(0)
    assert top_rows(torch.tensor([3.0, 1.0, 3.0, 0.0, 2.0]), 2, g).tolist() == [
        True, False, True, False, False,
    ]  # fmt: skip
    picks = {tuple(top_rows(torch.tensor([1.0, 1.0, 1.0, 0.0]), 2, g).tolist()) for _ in range(30)}
    assert all(p[3] is False and sum(p) == 2 for p in picks) and len(picks) == 3


def test_stage_two_keeps_the_top_rows_by_score(fed: FederatedTensors) -> None:
    model = _mlp([8])
    scores = {
        "fc1": torch.arange(8.0).flip(0),
        "fc2": torch.tensor([0.0, 9, 1, 8, 2, 7, 3, 6, 4, 5]),
    }
    state = fedbiad.ClientState(scores)
    cfg = fedbiad.Config(p=0.5, stage_boundary=3)
    _, res = _client(cfg, model, fed.train[0], round_=4, state=state)
    up = res.uplink.decode()  # type: ignore[attr-defined]
    assert up["mask/fc1"].tolist() == [True] * 4 + [False] * 4
    assert up["mask/fc2"].nonzero().squeeze(1).tolist() == [1, 3, 5, 7, 9]
    assert res.metrics["fedbiad/resamples"] == 0 and res.metrics["fedbiad/stage"] == 2.0  # type: ignore[attr-defined]
    for k, s in res.state.scores.items():  # type: ignore[attr-defined]
        assert torch.equal(s, scores[k])  # no score updates in stage two


# --- communication ---------------------------------------------------------------------------


def test_upload_is_32_bits_per_kept_entry_plus_one_bit_per_row(fed: FederatedTensors) -> None:
    # mlp 64-4-10, p = 0.5: fc1 keeps 2 of 4 rows of 64 + 1 entries (130), fc2 5 of 10 rows of
    # 4 + 1 (25): 32·155 + J (= 14) bits. Without dropping the output layer: fc2 goes whole
    # (50 entries) and J = 4. Download: 32·N, N = 4·65 + 10·5 = 310.
    down, res = _client(fedbiad.Config(p=0.5), _mlp([4]), fed.train[0])
    assert res.uplink.nbits().total == 32 * 155 + 14  # type: ignore[attr-defined]
    assert res.uplink.nbits().payload == 32 * 155 + 14  # type: ignore[attr-defined]
    _, res2 = _client(fedbiad.Config(p=0.5, drop_output_layer=False), _mlp([4]), fed.train[0])
    assert res2.uplink.nbits().total == 32 * (130 + 50) + 4  # type: ignore[attr-defined]
    model = _mlp([4])
    alg = build_algorithm(fedbiad.Config())
    server = alg.init_server(_params(model), RoundContext(0, torch.Generator(), 0, model))
    assert (
        alg.broadcast(server, 0, fedbiad.ClientState(), RoundContext(1, torch.Generator()))
        .nbits()
        .total
        == 32 * 310
    )
    # what the upload stands for is what the client kept
    assert alg.uploaded_model is not None
    uploaded = alg.uploaded_model(down, res.uplink.decode())  # type: ignore[attr-defined]
    for k, t in res.local_params.items():  # type: ignore[attr-defined]
        # U_{r−1} + (U_k − U_{r−1}) is U_k up to fp32 round-off; zeros exactly where dropped
        torch.testing.assert_close(uploaded[k], t, rtol=0, atol=1e-7)
        assert torch.equal(uploaded[k] != 0, t != 0)


def test_ledger_through_the_loop(fed: FederatedTensors) -> None:
    res = _run(fed, fedbiad.Config(p=0.5), rounds=1)
    frame = res.ledger.frame()
    n = 16 * 65 + 10 * 17  # mlp 64-16-10
    up = 32 * (8 * 65 + 5 * 17) + 26
    assert sorted(set(frame["payload_bits"].to_list())) == [up, 32 * n]


# --- aggregation -----------------------------------------------------------------------------


def _hand_uplinks(model: nn.Module, prev: dict[str, torch.Tensor]) -> list[Uplink]:
    """Clients A and B end local training at ``a`` and ``b``; they upload ``U_k − U_{r−1}``."""
    specs = row_specs(model, True)
    a = {"0.weight": torch.tensor([[2.0], [4.0], [-7.0]]), "0.bias": torch.tensor([0.5, 1.5, -7.0])}
    b = {"0.weight": torch.tensor([[6.0], [-9.0], [-9.0]]), "0.bias": torch.tensor([2.5, -9, -9])}
    beta_a = {"0": torch.tensor([True, True, False])}
    beta_b = {"0": torch.tensor([True, False, False])}
    delta_a = {k: a[k] - prev[k] for k in a}
    delta_b = {k: b[k] - prev[k] for k in b}
    return [
        Uplink(0, 1, encode_upload(delta_a, specs, beta_a).decode()),
        Uplink(1, 3, encode_upload(delta_b, specs, beta_b).decode()),
    ]


@pytest.mark.parametrize(
    ("aggregation", "weight", "bias"),
    [
        # Eq. 10, weights |D| = 1, 3 (Σ = 4); a dropped row counts as 0:
        #   row 0 (both kept): w (1·2 + 3·6)/4 = 5, b (1·0.5 + 3·2.5)/4 = 2
        #   row 1 (A only):    w (1·4 + 3·0)/4 = 1, b 1.5/4 = 0.375
        #   row 2 (nobody):    0, 0
        ("eq10", [5.0, 1.0, 0.0], [2.0, 0.375, 0.0]),
        # masked: row 0 as above; row 1 only A's 4 and 1.5; row 2 keeps U_{r−1} = 30, 3
        ("masked", [5.0, 4.0, 30.0], [2.0, 1.5, 3.0]),
        # fill: B's dropped row 1 is reconstructed as U_{r−1} = (20, 2) before Eq. 10:
        #   row 1: w (1·4 + 3·20)/4 = 16, b (1·1.5 + 3·2)/4 = 1.875; row 2: nobody moved it
        ("fill", [5.0, 16.0, 30.0], [2.0, 1.875, 3.0]),
    ],
)
def test_eq10_fill_and_masked_aggregation_by_hand(
    aggregation: str, weight: list[float], bias: list[float]
) -> None:
    model = nn.Sequential(nn.Linear(1, 3))
    prev = {"0.weight": torch.tensor([[10.0], [20.0], [30.0]]), "0.bias": torch.tensor([1.0, 2, 3])}
    alg = build_algorithm(fedbiad.Config(aggregation=aggregation))  # type: ignore[arg-type]
    state = alg.init_server(prev, RoundContext(0, torch.Generator(), 0, model))
    new = alg.server_update(state, _hand_uplinks(model, prev), RoundContext(1, torch.Generator()))
    torch.testing.assert_close(new.params["0.weight"].squeeze(1), torch.tensor(weight))
    torch.testing.assert_close(new.params["0.bias"], torch.tensor(bias))


def test_config_is_validated() -> None:
    for bad in ({"p": 1.0}, {"p": -0.1}, {"tau": 0}, {"B": 1}, {"alpha": 0.0}):
        with pytest.raises(ValidationError):
            fedbiad.Config(**bad)  # type: ignore[arg-type]


def test_momentum_and_weight_decay_path_trains_the_kept_rows_only(fed: FederatedTensors) -> None:
    # stage two (fixed β) with momentum and weight decay exercises the restore-after-step path
    # (the restored values are not visible outside: dropped rows are never uploaded)
    model = _mlp([8])
    scores = {"fc1": torch.arange(8.0), "fc2": torch.arange(10.0)}
    local = LocalConfig(steps=6, batch_size=8, lr=0.1, momentum=0.9, weight_decay=0.1)
    down, res = _client(
        fedbiad.Config(p=0.5, stage_boundary=0),
        model,
        fed.train[0],
        state=fedbiad.ClientState(scores),
        local=local,
    )
    up = res.uplink.decode()  # type: ignore[attr-defined]
    assert up["mask/fc1"].tolist() == [False] * 4 + [True] * 4
    got = res.local_params  # type: ignore[attr-defined]
    assert not got["fc1.weight"][:4].any() and not got["fc1.bias"][:4].any()
    assert (got["fc1.weight"][4:] != down["fc1.weight"][4:]).any()


def test_kl_weight_by_hand() -> None:
    # |D_k| = 56 examples, round 3, V = 20 local steps, α = 0.5
    client = fedbiad.Config(alpha=0.5, kl_samples="client")
    assert kl_weight(client, 56, 3, 20) == pytest.approx(1 / 28)  # 1/(α·|D_k|)
    seen = fedbiad.Config(alpha=0.5)  # the default: Theorem 1's m_r = r·V·|D_k|
    assert kl_weight(seen, 56, 3, 20) == pytest.approx(1 / (0.5 * 3 * 20 * 56))
    assert kl_weight(fedbiad.Config(kl=False), 56, 3, 20) == 0.0
    with pytest.raises(ValidationError):
        fedbiad.Config(kl_samples="all")  # type: ignore[arg-type]


@pytest.mark.parametrize(("next_columns", "column_1"), [("all", 5.0), ("holders", 4.0)])
def test_next_columns_averages_a_dropped_rows_readers_over_its_holders(
    next_columns: str, column_1: float
) -> None:
    # mlp 3-2-2, output rows kept: A (|D| = 1) keeps hidden unit 0 only, B (|D| = 3) both. Both
    # upload fc2 whole, A with +8 everywhere, B with +4. fc2's column 0 (read by both): (8 + 12)/4
    # = 5; column 1 reads A's dropped unit: all 5, holders only B's 4. fc2.bias is read by no
    # row: 5 either way. Bits are the same: this is the server's rule only.
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(1, 1, 3), num_classes=2, hidden=[2])
    prev = _params(model)
    specs = row_specs(model, False)
    cfg = fedbiad.Config(drop_output_layer=False, next_columns=next_columns)  # type: ignore[arg-type]
    alg = build_algorithm(cfg)
    state = alg.init_server(prev, RoundContext(0, torch.Generator(), 0, model))
    uplinks = [
        Uplink(k, n, encode_upload(
            {name: torch.full_like(t, up) for name, t in prev.items()}, specs,
            {"fc1": torch.tensor(keep)}).decode())
        for k, (n, up, keep) in enumerate([(1, 8.0, [True, False]), (3, 4.0, [True, True])])
    ]  # fmt: skip
    new = alg.server_update(state, uplinks, RoundContext(1, torch.Generator(), 0, model))
    step = {k: new.params[k] - prev[k] for k in prev}
    torch.testing.assert_close(step["fc2.weight"][:, 0], torch.full((2,), 5.0))
    torch.testing.assert_close(step["fc2.weight"][:, 1], torch.full((2,), column_1))
    torch.testing.assert_close(step["fc2.bias"], torch.full((2,), 5.0))
    torch.testing.assert_close(step["fc1.weight"][1], torch.full((3,), 4.0))  # masked: B's


def test_next_columns_holders_refuses_a_recurrent_model() -> None:
    alg = build_algorithm(fedbiad.Config(next_columns="holders"))
    assert alg.validate_model is not None
    alg.validate_model(_mlp([8]))
    with pytest.raises(ValueError, match="next_columns 'holders' needs a sequential model"):
        alg.validate_model(_lstm())
