"""FedAvg with a Laplace prior (Appendix J.1): median server, L1-proximal client, sign rule."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import build_algorithm, fedavg, fedavg_laplace
from fedcomm.algorithms.core import ClientContext, ClientData, RoundContext, Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.models import build_model
from fedcomm.server_opt import ServerOptConfig
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors

CTX = RoundContext(1, torch.Generator().manual_seed(0))
W = {"w": torch.tensor([1.0, 1.0, 1.0])}
# client models (not deltas); uploads are w_s − w
MODELS = [[2.0, 6.0, -1.0], [4.0, 0.0, 1.0], [3.0, 3.0, 11.0], [11.0, 1.0, 2.0]]


def _server_step(cfg: fedavg_laplace.Config, models: list[list[float]], n: list[int]) -> Tensor:
    alg = build_algorithm(cfg)
    state = alg.init_server(W, CTX)
    ups = [
        Uplink(i, k, {"w": torch.tensor(m) - W["w"]})
        for i, (m, k) in enumerate(zip(models, n, strict=True))
    ]
    return alg.global_params(alg.server_update(state, ups, CTX))["w"]


def test_median_of_an_odd_count_is_the_middle_value() -> None:
    # coordinate 0: 2, 3, 4 -> 3; coordinate 1: 0, 3, 6 -> 3; coordinate 2: -1, 1, 11 -> 1
    # (example counts and the server optimizer play no part)
    w = _server_step(fedavg_laplace.Config(), MODELS[:3], [1, 100, 1])
    assert w.tolist() == [3.0, 3.0, 1.0]


def test_median_of_an_even_count_is_the_mean_of_the_two_middle_values() -> None:
    # coordinate 0: 2, 3, 4, 11 -> (3+4)/2 = 3.5; coordinate 1: 0, 1, 3, 6 -> (1+3)/2 = 2;
    # coordinate 2: -1, 1, 2, 11 -> (1+2)/2 = 1.5 (torch.median would give 3, 1, 1)
    w = _server_step(fedavg_laplace.Config(), MODELS, [1, 1, 1, 1])
    assert w.tolist() == [3.5, 2.0, 1.5]


def test_median_ignores_an_outlier_client() -> None:
    # 3 honest clients near 1, one at 1e6: the median stays at (1 + 1.5)/2 = 1.25 on each coordinate
    models = [[0.5] * 3, [1.0] * 3, [1.5] * 3, [1e6] * 3]
    assert _server_step(fedavg_laplace.Config(), models, [1] * 4).tolist() == [1.25] * 3


def test_soft_threshold_proximal_step() -> None:
    # w = 1, τ = 0.1: d = w_s − w = [0.3, -0.05, -0.5, 0.1, 0.0] -> soft(d) = [0.2, 0, -0.4, 0, 0]
    anchor = {"w": torch.ones(5)}
    post = fedavg_laplace.prox_toward(anchor, 0.1)
    out = post({"w": torch.tensor([1.3, 0.95, 0.5, 1.1, 1.0])})["w"]
    assert out.tolist() == pytest.approx([1.2, 1.0, 0.6, 1.0, 1.0], abs=1e-6)
    assert torch.equal(out[[1, 3, 4]], torch.ones(3))  # |d| <= τ lands exactly on w


def test_sign_direction_is_the_mean_of_signs_times_lambda() -> None:
    # Δ_s = [1, -1, 0], [2, -3, 0], [-1, -2, 0.5]; signs summed = [1, -3, 1]; λ = 0.5, mean over 3
    deltas = [{"w": torch.tensor(d)} for d in ([1.0, -1, 0], [2.0, -3, 0], [-1.0, -2, 0.5])]
    g = fedavg_laplace.sign_direction(deltas, [1.0, 1.0, 1.0], 0.5)["w"]
    assert g.tolist() == pytest.approx([1 / 6, -0.5, 1 / 6])
    g = fedavg_laplace.sign_direction(deltas, [2.0, 1.0, 1.0], 0.5)["w"]  # client 0 counts twice
    assert g.tolist() == pytest.approx([0.5 * 2 / 4, -0.5, 0.5 / 4])


def test_gradient_rule_steps_toward_the_median() -> None:
    # w = 1; models of 3 clients: signs of w_s − w = [+,+,+], [+,-,+], [-,0,+] -> mean [1/3, 0, 1]
    sgd = fedavg_laplace.Config(server_rule="gradient", lam=0.5, server=ServerOptConfig(lr=1.0))
    models = [[2.0, 6.0, 3.0], [4.0, 0.0, 1.5], [0.0, 1.0, 11.0]]
    w = _server_step(sgd, models, [1, 1, 1])
    assert w.tolist() == pytest.approx([1 + 0.5 / 3, 1.0, 1.5])  # w + λ·mean sign
    # default Adam (lr 1e-3): the first bias-corrected step is lr·sign(g), 0 where g = 0
    w = _server_step(fedavg_laplace.Config(server_rule="gradient"), models, [1, 1, 1])
    assert w.tolist() == pytest.approx([1.001, 1.0, 1.001])


def _client_ctx(model: nn.Module, seed: int = 3) -> ClientContext:
    local = LocalConfig(epochs=2, batch_size=8, lr=0.1)
    return ClientContext(1, 0, model, local, torch.Generator().manual_seed(seed))


def _client_setup() -> tuple[nn.Module, dict[str, Tensor], ClientData]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3))
    g = torch.Generator().manual_seed(1)
    data = ClientData(torch.randn(20, 4, generator=g), torch.randint(0, 3, (20,), generator=g))
    return model, {k: v.detach().clone() for k, v in model.named_parameters()}, data


def test_lambda_zero_client_equals_fedavg_client() -> None:
    model, w, data = _client_setup()
    ours = build_algorithm(fedavg_laplace.Config(lam=0.0))
    base = build_algorithm(fedavg.Config())
    a = ours.client_update(w, None, data, _client_ctx(model))
    b = base.client_update(w, None, data, _client_ctx(model))
    assert all(torch.equal(a.local_params[k], b.local_params[k]) for k in w)
    assert a.uplink.decode().keys() == b.uplink.decode().keys()
    assert all(torch.equal(a.uplink.decode()[k], b.uplink.decode()[k]) for k in w)


def test_strong_prior_keeps_the_client_exactly_at_the_server_model() -> None:
    model, w, data = _client_setup()
    alg = build_algorithm(fedavg_laplace.Config(lam=1e3))  # lr·λ = 100 >> any gradient step
    res = alg.client_update(w, None, data, _client_ctx(model))
    assert all(torch.equal(res.local_params[k], w[k]) for k in w)
    assert res.metrics["fedavg_laplace/tied_fraction"] == 1.0


def test_config_rejects_negative_lambda() -> None:
    with pytest.raises(ValidationError):
        fedavg_laplace.Config(lam=-1.0)


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(4)


@pytest.mark.parametrize("rule", ["median", "gradient"])
def test_runs_through_the_loop(rule: str, fed: FederatedTensors) -> None:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=fed.num_classes, hidden=[8])
    cfg = loop.LoopConfig(rounds=2, clients_per_round=3, local=LocalConfig(batch_size=32), seed=1)
    alg = build_algorithm(fedavg_laplace.Config(server_rule=rule, lam=0.01))  # type: ignore[arg-type]
    res = loop.run(cfg, alg, model, fed, build_compressor("none"), config_hash="t")
    last = res.state.round_rows[-1]
    assert 0.0 <= last["global/accuracy"] <= 1.0
    assert 0.0 <= last["fedavg_laplace/tied_fraction"] <= 1.0
    numel = sum(p.numel() for p in model.parameters())
    assert set(res.ledger.frame()["payload_bits"].to_list()) == {32 * numel}  # FedAvg's cost
