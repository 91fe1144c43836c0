"""FedAvg with a mixture-of-Gaussians prior (Appendix J.2): an ensemble of K server models."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import build_algorithm, fedavg_mog, fedprox
from fedcomm.algorithms.core import (
    ClientContext,
    ClientData,
    RoundContext,
    Uplink,
    join_members,
    split_members,
)
from fedcomm.algorithms.core.local import LocalConfig, batch_schedule
from fedcomm.comm.codecs import build_compressor
from fedcomm.models import build_model
from fedcomm.server_opt import ServerOptConfig
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors

CTX = RoundContext(1, torch.Generator().manual_seed(0))
SGD1 = ServerOptConfig(optimizer="sgd", lr=1.0)
A = 1 / (1 + math.exp(-4))  # σ(4) = 0.982014
B = 1 - A  # 0.017986


def _scalars(*values: float) -> list[dict[str, Tensor]]:
    return [{"w": torch.tensor([float(v)])} for v in values]


def _server_step(cfg: fedavg_mog.Config, members: list[float], models: list[float]) -> object:
    alg = build_algorithm(cfg)
    state = alg.init_server({"w": torch.zeros(1)}, CTX)
    state = fedavg_mog.ServerState(tuple(_scalars(*members)), state.opt_state)
    ups = [Uplink(i, 10 * (i + 1), m) for i, m in enumerate(_scalars(*models))]
    return alg.server_update(state, ups, CTX)


def test_responsibilities_and_m_step_by_hand() -> None:
    # members w_1 = 0, w_2 = 4, λ = 1; clients at 1, 2, 3:
    # client 1: ‖·‖² = [1, 9] -> r = softmax([-0.5, -4.5]) = [σ(4), 1 − σ(4)] = [A, B]
    # client 2: [4, 4] -> [0.5, 0.5];  client 3: [9, 1] -> [B, A];  Σ_s r_sk = 1.5 for both
    # w_1 = (A·1 + 0.5·2 + B·3)/1.5 = (4 − 2A)/1.5 = 1.357315
    # w_2 = (B·1 + 0.5·2 + A·3)/1.5 = (2 + 2A)/1.5 = 2.642685  (example counts play no part)
    r = fedavg_mog.responsibilities(fedavg_mog.sq_distances(_scalars(1, 2, 3), _scalars(0, 4)), 1.0)
    assert r.tolist() == [pytest.approx([A, B]), [0.5, 0.5], pytest.approx([B, A])]
    state = _server_step(fedavg_mog.Config(), [0, 4], [1, 2, 3])
    assert isinstance(state, fedavg_mog.ServerState)
    assert [m["w"].item() for m in state.members] == pytest.approx([1.357315, 2.642685], abs=1e-6)
    # entropy: (2·H(A) + ln 2)/3 with H(A) = −A ln A − B ln B = 0.090094 -> 0.291112
    assert state.entropy == pytest.approx(0.291112, abs=1e-6)
    assert state.mass == pytest.approx((0.5, 0.5))


def test_adam_rule_direction_by_hand() -> None:
    # same example; direction_1 = (1/3)(A·1 + 0.5·2 + B·3) = (4 − 2A)/3 = 0.678657,
    # direction_2 = (1/3)(B·(−3) + 0.5·(−2) + A·(−1)) = −(4 − 2A)/3; server SGD lr 1 applies it
    cfg = fedavg_mog.Config(server_rule="adam", server=SGD1)
    state = _server_step(cfg, [0, 4], [1, 2, 3])
    assert isinstance(state, fedavg_mog.ServerState)
    assert [m["w"].item() for m in state.members] == pytest.approx([0.678657, 3.321343], abs=1e-6)


def test_huge_distances_give_finite_responsibilities() -> None:
    # a naive exp(−λ/2·1e10) underflows to 0/0; log-sum-exp keeps the ratio: softmax([0, −1])
    r = fedavg_mog.responsibilities(torch.tensor([[1e10, 1e10 + 2]], dtype=torch.float64), 1.0)
    assert r[0].tolist() == pytest.approx([1 / (1 + math.exp(-1)), 1 / (1 + math.e)])
    # members 1e4 apart: one-hot rows; the unclaimed member 1e8 away keeps its value
    state = _server_step(fedavg_mog.Config(), [0, 1e4, 1e8], [1, 2, 1e4 + 3])
    assert isinstance(state, fedavg_mog.ServerState)
    assert [m["w"].item() for m in state.members] == [1.5, 1e4 + 3, 1e8]
    assert math.isfinite(state.entropy) and state.entropy == pytest.approx(0.0, abs=1e-12)


def test_one_component_m_step_is_the_unweighted_mean_of_client_models() -> None:
    # K = 1: r_s1 = 1, so w = (1 + 2 + 6)/3 = 3 whatever the member was and the example counts
    # (10, 20, 30) are; this is FedAvg with uniform weighting and server SGD at lr 1
    state = _server_step(fedavg_mog.Config(components=1), [-7], [1, 2, 6])
    assert isinstance(state, fedavg_mog.ServerState)
    assert state.members[0]["w"].item() == pytest.approx(3.0)


def test_mixture_term_sign_by_hand() -> None:
    # members 0 and 2, w_s = 1, λ = 1: log Σ_k ½ exp(−½·1) = −0.5 -> loss − (−0.5) = loss + 0.5
    hook = fedavg_mog.mixture_hook(_scalars(0, 2), 1.0)
    assert hook({"w": torch.tensor([1.0])}, torch.tensor(2.0)).item() == pytest.approx(2.5)


def _linear_setup() -> tuple[list[dict[str, Tensor]], ClientData, ClientContext]:
    """Linear 2-class model; member 0 predicts y = 0 everywhere, member 1 y = 1 everywhere.
    The client's first local batch is all class 0, every other example class 1."""
    members = [
        {"weight": torch.zeros(2, 2), "bias": torch.tensor([5.0, -5.0] if k == 0 else [-5.0, 5.0])}
        for k in range(2)
    ]
    local = LocalConfig(epochs=1, batch_size=4, lr=0.1)
    ctx = ClientContext(1, 0, nn.Linear(2, 2), local, torch.Generator().manual_seed(5))
    probe = torch.Generator()
    probe.set_state(ctx.generator.get_state())
    y = torch.ones(12, dtype=torch.long)
    y[batch_schedule(12, local, probe)[0]] = 0
    return members, ClientData(torch.randn(12, 2, generator=probe), y), ctx


def test_client_starts_from_the_member_best_on_its_first_local_batch() -> None:
    members, data, ctx = _linear_setup()
    before = ctx.generator.get_state()
    assert fedavg_mog.pick_member(members, data, ctx) == 0  # though member 1 fits 8 of 12
    assert fedavg_mog.pick_member(members[::-1], data, ctx) == 1
    assert torch.equal(ctx.generator.get_state(), before)  # local SGD draws the same schedule
    alg = build_algorithm(fedavg_mog.Config())
    res = alg.client_update(join_members(members), None, data, ctx)
    assert res.metrics["fedavg_mog/init_member0"] == 1.0
    assert res.metrics["fedavg_mog/init_member1"] == 0.0
    assert set(res.uplink.decode()) == {"weight", "bias"}  # one model up


def test_members_start_apart_and_replay_from_the_seed() -> None:
    alg = build_algorithm(fedavg_mog.Config(components=3))
    p = {"w": torch.zeros(50)}
    a, b = alg.init_server(p, RoundContext(0, CTX.generator, 4)), alg.init_server(p, CTX)
    a2 = alg.init_server(p, RoundContext(0, torch.Generator(), 4))
    assert all(torch.equal(x["w"], y["w"]) for x, y in zip(a.members, a2.members, strict=True))
    assert not torch.equal(a.members[0]["w"], a.members[1]["w"])
    assert not torch.equal(a.members[0]["w"], b.members[0]["w"])  # another run seed
    assert 0.005 < float(a.members[0]["w"].std()) < 0.02  # init_noise = 0.01


def test_config_requires_positive_lambda_and_components() -> None:
    with pytest.raises(ValidationError):
        fedavg_mog.Config(lam=0.0)
    with pytest.raises(ValidationError):
        fedavg_mog.Config(components=0)


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(4)


def _run(fed: FederatedTensors, cfg: object) -> tuple[loop.RunResult, int]:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=fed.num_classes, hidden=[8])
    lcfg = loop.LoopConfig(rounds=2, clients_per_round=3, local=LocalConfig(batch_size=32), seed=1)
    alg = build_algorithm(cfg)  # type: ignore[arg-type]
    res = loop.run(lcfg, alg, model, fed, build_compressor("none"), config_hash="t")
    return res, sum(p.numel() for p in model.parameters())


def test_loop_costs_and_ensemble_metrics(fed: FederatedTensors) -> None:
    res, numel = _run(fed, fedavg_mog.Config(components=3))
    frame = res.ledger.frame()
    down = frame.filter(frame["direction"] == "down")["payload_bits"].to_list()
    up = frame.filter(frame["direction"] == "up")["payload_bits"].to_list()
    assert set(down) == {3 * 32 * numel} and set(up) == {32 * numel}  # K models down, 1 up
    last = res.state.round_rows[-1]
    for k in range(3):
        assert 0.0 <= last[f"global/member{k}/accuracy"] <= 1.0
        assert 0.0 <= last[f"fedavg_mog/member{k}_mass"] <= 1.0
    assert 0.0 <= last["fedavg_mog/responsibility_entropy"] <= math.log(3) + 1e-9
    assert sum(last[f"fedavg_mog/init_member{k}"] for k in range(3)) == pytest.approx(1.0)
    assert len(split_members(res.final_params)) == 3


def test_one_component_run_is_fedprox_with_uniform_weights(fed: FederatedTensors) -> None:
    mog, _ = _run(fed, fedavg_mog.Config(components=1, lam=0.1, init_noise=0.0))
    prox, _ = _run(fed, fedprox.Config(mu=0.1, weighting="uniform", server=SGD1))
    (member,) = split_members(mog.final_params)
    for k, v in prox.final_params.items():
        torch.testing.assert_close(member[k], v, rtol=1e-5, atol=1e-6)
