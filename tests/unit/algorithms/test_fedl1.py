"""FedL1 against the spec (specs/fedsparse-fedbiad.md §1.6; paper Appendix A, Eqs. 24-25):
hard threshold by group norm, the group-L1 gradient, message sizes, the reduction to FedAvg, and
sparsity growing with λ."""

from __future__ import annotations

import pytest
import torch
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import build_algorithm, fedavg, fedl1
from fedcomm.algorithms.core import AlgorithmConfig, ClientContext, RoundContext
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.models import build_model, groups
from fedcomm.models.groups import group_norms
from fedcomm.server_opt import ServerOptConfig
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _hand_model() -> tuple[nn.Module, dict[str, Tensor]]:
    """mlp 3-2-2; with λ = 1 the fc1 input groups have norms 5, 1 (== λ: pruned), 0.5 and the
    fc2 input groups √2 and 0.6; biases are ungrouped."""
    model = build_model("mlp", input_shape=(3,), num_classes=2, hidden=[2])
    params = {
        "fc1.weight": torch.tensor([[3.0, 0.0, 0.5], [4.0, 1.0, 0.0]]),
        "fc1.bias": torch.tensor([7.0, 8.0]),
        "fc2.weight": torch.tensor([[1.0, -0.6], [1.0, 0.0]]),
        "fc2.bias": torch.tensor([9.0, 9.0]),
    }
    return model, params


def _run(fed: FederatedTensors, cfg: AlgorithmConfig, rounds: int = 2) -> loop.RunResult:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[16])
    lc = loop.LoopConfig(
        rounds=rounds, clients_per_round=3, local=LocalConfig(steps=10, batch_size=16), seed=7
    )
    return loop.run(lc, build_algorithm(cfg), model, fed, build_compressor("none"), config_hash="t")


def test_hard_threshold_zeroes_exactly_the_groups_with_norm_at_most_lambda() -> None:
    model, params = _hand_model()
    sparse, keep = fedl1.hard_threshold(params, groups(model), 1.0)
    assert {k: v.tolist() for k, v in keep.items()} == {
        "fc1": [True, False, False],
        "fc2": [True, False],
    }
    assert sparse["fc1.weight"].tolist() == [[3.0, 0.0, 0.0], [4.0, 0.0, 0.0]]
    assert sparse["fc2.weight"].tolist() == [[1.0, 0.0], [1.0, 0.0]]
    assert torch.equal(sparse["fc1.bias"], params["fc1.bias"])  # ungrouped: never pruned
    alg = build_algorithm(fedl1.Config(threshold=1.0))
    state = alg.init_server(params, RoundContext(0, torch.Generator(), 0, model))
    assert all(torch.equal(alg.global_params(state)[k], v) for k, v in sparse.items())
    assert torch.equal(state.params["fc1.weight"], params["fc1.weight"])  # w itself unpruned


def test_l1_gradient_is_lambda_times_the_unit_group_direction() -> None:
    torch.manual_seed(0)
    model = build_model(
        "mnist_cnn", input_shape=(1, 8, 8), num_classes=3, channels=[2, 3], hidden=4
    )
    params = {k: v.detach().clone().requires_grad_(True) for k, v in model.named_parameters()}
    lam = 0.3
    loss = fedl1.group_l1(groups(model), lam)(params, torch.zeros(()))
    raw = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    grads = {
        k: torch.zeros_like(v) if g is None else g
        for (k, v), g in zip(params.items(), raw, strict=True)
    }
    p = {k: v.detach() for k, v in params.items()}
    for conv in ("conv1", "conv2"):  # filter g: W[g] and b[g] together
        w, b = p[f"{conv}.weight"], p[f"{conv}.bias"]
        norm = (w.flatten(1).pow(2).sum(1) + b.pow(2)).sqrt()  # (filters,)
        torch.testing.assert_close(grads[f"{conv}.weight"], lam * w / norm.view(-1, 1, 1, 1))
        torch.testing.assert_close(grads[f"{conv}.bias"], lam * b / norm)
    for fc in ("fc1", "fc2"):  # input feature g: W[:, g]; the bias is not penalised
        w = p[f"{fc}.weight"]
        torch.testing.assert_close(grads[f"{fc}.weight"], lam * w / w.norm(dim=0))
        assert not grads[f"{fc}.bias"].any()


def test_messages_cost_32_bits_per_kept_group_parameter_plus_a_bit_per_group(
    fed: FederatedTensors,
) -> None:
    model, params = _hand_model()
    alg = build_algorithm(fedl1.Config(threshold=1.0))
    rctx = RoundContext(1, torch.Generator(), 0, model)
    down = alg.broadcast(alg.init_server(params, rctx), 0, None, rctx)
    # kept: fc1 group 0 (2 values) + fc2 group 0 (2) + 4 biases = 8 values; 3 + 2 = 5 groups
    assert down.nbits().total == 32 * 8 + 5
    assert down.nbits().index == down.nbits().meta == 0
    decoded = fedl1.decode(down.decode(), params, groups(model))
    sparse, _ = fedl1.hard_threshold(params, groups(model), 1.0)
    assert all(torch.equal(decoded[k], v) for k, v in sparse.items())
    data = fed.train[0]
    x = data.x.reshape(len(data.x), -1)[:, :3]  # 3 features to fit the hand model
    small = type(data)(x, data.y % 2)
    cctx = ClientContext(1, 0, model, LocalConfig(lr=0.01), torch.Generator().manual_seed(0))
    res = alg.client_update(down.decode(), None, small, cctx)
    nonzero = [int((group_norms(res.local_params, s) > 0).sum()) for s in groups(model)]
    kept = 2 * sum(nonzero)  # every group of this model has 2 parameters
    assert res.uplink.nbits().total == 32 * (kept + 4) + 5


def test_threshold_zero_equals_fedavg_with_server_adam(fed: FederatedTensors) -> None:
    l1 = _run(fed, fedl1.Config(threshold=0.0))
    adam = ServerOptConfig(optimizer="adam", lr=1e-3)
    avg = _run(fed, fedavg.Config(weighting="uniform", server=adam))
    assert all(torch.equal(l1.final_params[k], avg.final_params[k]) for k in avg.final_params)
    for a, b in zip(l1.state.round_rows, avg.state.round_rows, strict=True):
        assert a["global/accuracy"] == b["global/accuracy"]
        assert a["local/accuracy"] == b["local/accuracy"]
    n_groups = 64 + 16  # fc1 and fc2 input features: the only extra bits are the group masks
    for r1, r2 in zip(l1.ledger.rows, avg.ledger.rows, strict=True):
        assert r1[3] == r2[3] + n_groups


def test_sparsity_grows_with_lambda_and_over_rounds(fed: FederatedTensors) -> None:
    rows = {
        lam: _run(fed, fedl1.Config(threshold=lam), 4).state.round_rows for lam in (0, 0.25, 0.3)
    }
    final = {lam: r[-1]["model/sparsity"] for lam, r in rows.items()}
    assert final[0] == 0.0 < final[0.25] < final[0.3]
    assert rows[0.25][-1]["model/sparsity"] > rows[0.25][0]["model/sparsity"]
    assert rows[0.3][-1]["fedl1/kept_groups"] < 1.0


def test_prune_output_false_keeps_the_output_layer_dense() -> None:
    model, params = _hand_model()
    alg = build_algorithm(fedl1.Config(threshold=100.0, prune_output=False))
    rctx = RoundContext(1, torch.Generator(), 0, model)
    state = alg.init_server(params, rctx)
    assert [s.name for s in state.specs] == ["fc1"]
    pruned = alg.global_params(state)
    assert not pruned["fc1.weight"].any()
    assert torch.equal(pruned["fc2.weight"], params["fc2.weight"])
    assert alg.broadcast(state, 0, None, rctx).nbits().total == 32 * (2 + 4 + 2) + 3
