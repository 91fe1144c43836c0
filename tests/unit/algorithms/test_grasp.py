"""GraSP (specs/feddst-progfed.md §1(d)): the score −θ ⊙ Hg against a finite-difference
Hessian-vector product, the kept set (global and per layer), the warm start through the loop
(exact density, fixed mask, round-0 charge) and the code's density bug replayed."""

from __future__ import annotations

import math

import pytest
import torch
from tests.conftest import digits_federation
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm.algorithms import build_algorithm, grasp
from fedcomm.algorithms.core import AlgorithmConfig, ClientData
from fedcomm.algorithms.core.local import LocalConfig, cross_entropy
from fedcomm.algorithms.sparse import masks as _masks
from fedcomm.comm.codecs import build_compressor
from fedcomm.models import build_model
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def test_scores_match_a_finite_difference_hessian_vector_product() -> None:
    # a smooth float64 net (tanh), 5 examples in minibatches of 2 (sums over 3 batches)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    data = ClientData(torch.randn(5, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 1, 0]))
    T, names = 2.0, ["0.weight", "2.weight"]

    def grad(w: dict[str, Tensor]) -> list[Tensor]:  # G(θ) = Σ_b ∇_θ L_b, biases held fixed
        total = [torch.zeros_like(w[k]) for k in names]
        for idx in torch.arange(5).split(2):
            leaves = {k: w[k].detach().requires_grad_(True) for k in names}
            logits = functional_call(model, {**params, **leaves}, (data.x[idx],))
            loss = cross_entropy(logits / T, data.y[idx])
            for acc, g in zip(total, torch.autograd.grad(loss, list(leaves.values())), strict=True):
                acc.add_(g)
        return total

    g = grad(params)
    eps = 1e-5
    plus = grad({**params, **{k: params[k] + eps * gk for k, gk in zip(names, g, strict=True)}})
    minus = grad({**params, **{k: params[k] - eps * gk for k, gk in zip(names, g, strict=True)}})
    scores = grasp.grasp_scores(model, params, data, batch_size=2, temperature=T)
    assert list(scores) == names  # maskable weights only
    for k, p, m in zip(names, plus, minus, strict=True):
        hg = (p - m) / (2 * eps)  # H·g by central differences
        assert torch.allclose(scores[k], -params[k] * hg, rtol=1e-5, atol=1e-10)
        assert scores[k].abs().max() > 1e-6  # not trivially zero


def test_mask_keeps_the_smallest_scores_globally_or_per_layer() -> None:
    scores = {"a": torch.tensor([3.0, -1.0, 2.0]), "b": torch.tensor([[0.0, 5.0]])}
    glob = grasp.grasp_mask(scores, 2)  # the two smallest S(−θ) overall: −1 (a) and 0 (b)
    assert glob["a"].tolist() == [False, True, False] and glob["b"].tolist() == [[True, False]]
    per_layer = grasp.grasp_mask(scores, {"a": 2, "b": 1})
    assert per_layer["a"].tolist() == [False, True, True]
    assert per_layer["b"].tolist() == [[True, False]]


def _run(fed: FederatedTensors, cfg: AlgorithmConfig, rounds: int) -> loop.RunResult:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[16])
    lc = loop.LoopConfig(
        rounds=rounds,
        clients_per_round=3,
        local=LocalConfig(epochs=1, batch_size=16, lr=0.1),
        seed=3,
    )
    return loop.run(lc, build_algorithm(cfg), model, fed, build_compressor("none"), config_hash="t")


def _warm(fed: FederatedTensors, cfg: grasp.Config) -> tuple[object, dict[str, Tensor]]:
    """The server state after the warm start, and the initial parameters."""
    from fedcomm.algorithms.core import RoundContext, WarmStartContext

    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[16])
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    alg = build_algorithm(cfg)
    state = alg.init_server(init, RoundContext(0, torch.Generator(), 0, model))
    assert alg.warm_start is not None
    ctx = WarmStartContext(torch.Generator(), 0, model, LocalConfig(batch_size=16))
    state, _ = alg.warm_start(state, fed.train, ctx)
    return state, init


def test_warm_start_masks_client_zeros_scores_at_exactly_the_target_density(
    fed: FederatedTensors,
) -> None:
    state, init = _warm(fed, grasp.Config(sparsity=0.8))
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[16])
    scores = grasp.grasp_scores(model, init, fed.train[0], 16)
    kept = round(0.2 * 1184)  # N_m = 64·16 + 16·10
    expected = grasp.grasp_mask(scores, kept)
    assert all(torch.equal(state.masks[k], m) for k, m in expected.items())  # type: ignore[attr-defined]
    assert _masks.count(state.masks) == (kept, 1184)  # type: ignore[attr-defined]
    assert dict(state.budgets) == {k: int(m.sum()) for k, m in expected.items()}  # type: ignore[attr-defined]
    assert torch.equal(state.params["fc1.bias"], init["fc1.bias"])  # type: ignore[attr-defined]
    assert torch.all(state.params["fc1.weight"][~state.masks["fc1.weight"]] == 0)  # type: ignore[attr-defined]


def test_per_layer_scope_uses_the_distribution_budgets(fed: FederatedTensors) -> None:
    state, _ = _warm(fed, grasp.Config(sparsity=0.8, scope="layer", distribution="uniform"))
    assert {k: int(m.sum()) for k, m in state.masks.items()} == {  # type: ignore[attr-defined]
        "fc1.weight": round(0.2 * 1024),
        "fc2.weight": round(0.2 * 160),
    }


def test_trains_with_the_grasp_mask_fixed_and_charges_the_warm_start_mask(
    fed: FederatedTensors,
) -> None:
    state, _ = _warm(fed, grasp.Config())
    res = _run(fed, grasp.Config(), rounds=3)
    assert all(torch.equal(res.state.server.masks[k], m) for k, m in state.masks.items())  # type: ignore[attr-defined]
    assert [r["grasp/mask_churn"] for r in res.state.round_rows] == [0.0] * 3
    assert [r for r in res.ledger.rows if r[0] == 0] == [
        (0, 0, "up", 1184, 0, 0, 1184, "sent", 1184, 0)
    ]
    free = _run(fed, grasp.Config(warm_start_charge="none"), rounds=1)
    assert min(r[0] for r in free.ledger.rows) == 1  # the code's accounting: no round-0 message


def test_official_density_bug_is_replayed(fed: FederatedTensors) -> None:
    # Synflow keeps the fraction S: N_m − ⌊0.2·1184⌋ = 948 weights; after round 1 the server
    # magnitude-prunes to the code's budgets k_l(0.8), and the mask is fixed from then on
    state, _ = _warm(fed, grasp.Config(official_density=True))
    assert _masks.count(state.masks) == (1184 - math.floor(0.2 * 1184), 1184)  # type: ignore[attr-defined]
    res = _run(fed, grasp.Config(official_density=True), rounds=3)
    rows = res.state.round_rows
    budgets = res.state.server.budgets
    assert {k: int(m.sum()) for k, m in res.state.server.masks.items()} == dict(budgets)
    assert rows[0]["grasp/mask_churn"] > 0.5 and rows[1]["grasp/mask_churn"] == 0.0
    assert rows[1]["grasp/density"] == pytest.approx(sum(budgets.values()) / 1184)


def test_random_client_is_drawn_from_the_warm_start_generator(fed: FederatedTensors) -> None:
    from fedcomm.algorithms.core import RoundContext, WarmStartContext

    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[16])
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    alg = build_algorithm(grasp.Config(client="random", warm_start_charge="mask"))
    assert alg.warm_start is not None
    chosen = []
    for seed in range(6):
        state = alg.init_server(init, RoundContext(0, torch.Generator(), 0, model))
        gen = torch.Generator().manual_seed(seed)
        ctx = WarmStartContext(gen, seed, model, LocalConfig(batch_size=16))
        state, messages = alg.warm_start(state, fed.train, ctx)
        ((cid, direction, _),) = messages
        expected = int(torch.randint(6, (1,), generator=torch.Generator().manual_seed(seed)))
        assert (cid, direction) == (expected, "up")
        scores = grasp.grasp_scores(model, init, fed.train[cid], 16)
        assert torch.equal(state.masks["fc1.weight"], grasp.grasp_mask(scores, 237)["fc1.weight"])
        chosen.append(cid)
    assert len(set(chosen)) > 1
