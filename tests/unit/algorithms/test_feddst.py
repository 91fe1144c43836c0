"""FedDST and RandomMask against the spec (specs/feddst-progfed.md §1(a), §1(c)): layer budgets
(the code's table, true ERK, uniform), readjustment by hand and through a client, the server's
sparse average and union prune by hand, fixed masks at α = 0, the schedule, and the counting rule
through the actual payloads and ledger."""

from __future__ import annotations

import math

import pytest
import torch
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import build_algorithm, randommask
from fedcomm.algorithms.core import AlgorithmConfig, ClientContext, RoundContext, Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.feddst import algorithm as feddst
from fedcomm.algorithms.feddst.client import ClientState
from fedcomm.algorithms.feddst.readjust import DEFAULT_READJUST_END, Readjustment, readjust
from fedcomm.algorithms.sparse import budgets as _budgets
from fedcomm.algorithms.sparse import codec as _codec
from fedcomm.algorithms.sparse import masks as _masks
from fedcomm.comm.codecs import build_compressor
from fedcomm.models import build_model
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


class _Net(nn.Module):
    """Layers only (no forward): the FedDST code's nets, for the budget table."""

    def __init__(self, convs: list[tuple[int, int]], fcs: list[tuple[int, int]]) -> None:
        super().__init__()
        for i, (c_in, c_out) in enumerate(convs, 1):
            self.add_module(f"conv{i}", nn.Conv2d(c_in, c_out, 5))
        for i, (f_in, f_out) in enumerate(fcs, 1):
            self.add_module(f"fc{i}", nn.Linear(f_in, f_out))


MNIST = ([(1, 10), (10, 20)], [(5120, 50), (50, 10)])
CIFAR10 = ([(3, 6), (6, 16)], [(6400, 120), (120, 84), (84, 10)])


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[16])


def _params(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# --- budgets -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("net", "expected"),
    [(MNIST, [0.260, 0.191, 0.200, 0.286]), (CIFAR10, [0.229, 0.205, 0.200, 0.211, 0.286])],
)
def test_official_budgets_reproduce_the_spec_table(
    net: tuple[list[tuple[int, int]], list[tuple[int, int]]], expected: list[float]
) -> None:
    layers = _masks.maskable_layers(_Net(*net))
    budgets = _budgets.layer_budgets(layers, 0.8, "official")
    assert [round(budgets[la.name] / la.numel, 3) for la in layers] == expected
    assert budgets["conv1.weight"] == (65 if net is MNIST else 103)  # ⌊(1 − s_1)·n_1⌋


@pytest.mark.parametrize("distribution", ["official", "erk", "uniform"])
@pytest.mark.parametrize("sparsity", [0.5, 0.8, 0.95])
def test_budgets_sum_to_the_target(distribution: str, sparsity: float) -> None:
    layers = _masks.maskable_layers(_Net(*CIFAR10))
    budgets = _budgets.layer_budgets(layers, sparsity, distribution)  # type: ignore[arg-type]
    assert all(0 < budgets[la.name] <= la.numel for la in layers)
    total = sum(budgets.values())
    n_m = sum(la.numel for la in layers)
    if distribution == "official":  # Σ ⌊(1 − s_l) n_l⌋ with Σ (1 − s_l) n_l = (1 − S) Σ n_l
        with_biases = (1 - sparsity) * sum(la.numel + la.biases for la in layers)
        assert with_biases - len(layers) < total <= with_biases
    else:
        assert total == round((1 - sparsity) * n_m)


def test_erk_caps_a_dense_layer_and_redistributes() -> None:
    # MNIST net at S = 0.8: fc2's ERK density ε·60/500 would exceed 1, so fc2 is dense and
    # ε = (0.2·261,250 − 0.8·500) / (21 + 40 + 5170) = 51,850 / 5231 solves the others;
    # layer l then keeps ε·Σshape_l weights (conv1 21, conv2 40, fc1 5170).
    layers = _masks.maskable_layers(_Net(*MNIST))
    budgets = _budgets.layer_budgets(layers, 0.8, "erk")
    eps = 51_850 / 5231
    assert budgets["fc2.weight"] == 500
    for name, dims in [("conv1.weight", 21), ("conv2.weight", 40), ("fc1.weight", 5170)]:
        assert abs(budgets[name] - eps * dims) < 1
    assert sum(budgets.values()) == 52_350


def test_uniform_keeps_one_minus_s_of_every_layer() -> None:
    layers = _masks.maskable_layers(_Net(*CIFAR10))
    budgets = _budgets.layer_budgets(layers, 0.7, "uniform")
    assert all(abs(budgets[la.name] - 0.3 * la.numel) < 1 for la in layers)


def test_maskable_layers_are_conv_and_linear_weights_including_first_and_last() -> None:
    layers = _masks.maskable_layers(_Net(*MNIST))
    assert [(la.name, la.biases) for la in layers] == [
        ("conv1.weight", 10),
        ("conv2.weight", 20),
        ("fc1.weight", 50),
        ("fc2.weight", 10),
    ]


def test_top_k_breaks_ties_by_lower_index() -> None:
    scores = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0])
    assert _masks.top_k(scores, 2).tolist() == [False, True, True, False, False]
    among = torch.tensor([True, False, True, True, True])
    assert _masks.top_k(scores, 3, among).tolist() == [False, False, True, True, True]
    assert _masks.top_k(scores, 9, among).sum() == 4  # at most the candidates


# --- readjustment --------------------------------------------------------------------------------

# One layer of 6 entries, 4 active (k(S) = 4); prune to k(S') = 2, grow 2 by |g|.
THETA = {"w": torch.tensor([0.9, -0.5, 0.0, 0.3, 0.0, -0.1])}
MASK = {"w": torch.tensor([True, True, False, True, False, True])}
GRAD = {"w": torch.tensor([0.0, 0.8, 0.7, 0.1, 0.2, 0.6])}


def test_readjust_grows_inactive_entries_to_exactly_the_budget() -> None:
    # keep |0.9|, |−0.5|; the inactive pool {2, 3, 4, 5} has |g| 0.7, 0.1, 0.2, 0.6: grow 2 and 5
    params, masks = readjust(THETA, MASK, GRAD, {"w": 2}, {"w": 4}, "inactive")
    assert masks["w"].tolist() == [True, True, True, False, False, True]
    assert params["w"].tolist() == pytest.approx([0.9, -0.5, 0, 0, 0, 0])  # grown: start at 0


def test_readjust_over_all_entries_may_reset_active_ones_and_end_below_budget() -> None:
    # the code: top-2 |g| over the whole layer = entries 1 (active, reset to 0) and 2
    params, masks = readjust(THETA, MASK, GRAD, {"w": 2}, {"w": 4}, "all")
    assert masks["w"].tolist() == [True, True, True, False, False, False]
    assert params["w"].tolist() == pytest.approx([0.9, 0, 0, 0, 0, 0])


@pytest.mark.parametrize("at_epoch", [None, 0])
def test_client_readjustment_keeps_exactly_the_layer_budgets(
    fed: FederatedTensors, at_epoch: int | None
) -> None:
    model = _mlp()
    cfg = feddst.Config(alpha=0.5, grow_candidates="inactive", readjust_at_epoch=at_epoch)
    alg = build_algorithm(cfg)
    server = alg.init_server(_params(model), RoundContext(0, torch.Generator(), 0, model))
    down = alg.broadcast(server, 0, ClientState(), RoundContext(1, torch.Generator()))
    local = LocalConfig(epochs=2, batch_size=16, lr=0.1, momentum=0.9, weight_decay=1e-3)
    ctx = ClientContext(1, 0, model, local, torch.Generator().manual_seed(0))
    res = alg.client_update(down.decode(), ClientState(), fed.train[0], ctx)
    params, masks = _codec.decode(res.uplink.decode())
    assert {k: int(m.sum()) for k, m in masks.items()} == dict(server.budgets)
    assert not torch.equal(masks["fc1.weight"], server.masks["fc1.weight"])  # it moved
    assert all(torch.all(params[k][~m] == 0) for k, m in masks.items())  # masked after steps
    assert res.metrics["feddst/client_churn"] > 0
    assert math.isfinite(res.metrics["train/loss"])


# --- server --------------------------------------------------------------------------------------


def test_server_sparse_average_and_union_prune_by_hand() -> None:
    # One Linear(4 -> 1), uniform budgets at S = 0.5: k = 2. θ_0 = [1, 2, 0.1, 0.05] -> m_0 = [1100]
    # client A (n = 3): θ = [1, 2, ·, ·],  m = [1100], b = 0.3
    # client B (n = 1): θ = [3, ·, −4, ·], m = [1010], b = 0.7
    # entrywise: (3·1 + 1·3)/4 = 1.5; 3·2/3 = 2; 1·(−4)/1 = −4; nobody -> 0; union [1110]
    # prune the union to k = 2 by |θ|: keep 2 and −4 -> m = [0110], θ = [0, 2, −4, 0]
    # bias: (3·0.3 + 1·0.7)/4 = 0.4; churn: bits 0 and 2 changed -> 2/4
    model = nn.Linear(4, 1)
    alg = build_algorithm(randommask.Config(sparsity=0.5, distribution="uniform"))
    init = {"weight": torch.tensor([[1.0, 2.0, 0.1, 0.05]]), "bias": torch.tensor([0.0])}
    state = alg.init_server(init, RoundContext(0, torch.Generator(), 0, model))
    assert state.masks["weight"].tolist() == [[True, True, False, False]]

    def up(w: list[float], m: list[bool], b: float, n: int, cid: int) -> Uplink:
        params = {"weight": torch.tensor([w]), "bias": torch.tensor([b])}
        masks = {"weight": torch.tensor([m])}
        return Uplink(cid, n, _codec.encode(params, masks, "sent").decode())

    uplinks = [
        up([1.0, 2.0, 0.0, 0.0], [True, True, False, False], 0.3, 3, 0),
        up([3.0, 0.0, -4.0, 0.0], [True, False, True, False], 0.7, 1, 1),
    ]
    new = alg.server_update(state, uplinks, RoundContext(1, torch.Generator()))
    assert new.masks["weight"].tolist() == [[False, True, True, False]]
    assert new.params["weight"].tolist() == [[0.0, 2.0, -4.0, 0.0]]
    assert new.params["bias"].tolist() == pytest.approx([0.4])
    assert alg.server_metrics(new) == {"mask_churn": 0.5, "density": 0.5, "readjusted": 0.0}
    avg, union = _masks.masked_average(
        [_codec.decode(u.tensors)[0] for u in uplinks],
        [_codec.decode(u.tensors)[1] for u in uplinks],
        [3.0, 1.0],
    )
    assert avg["weight"].tolist() == [[1.5, 2.0, -4.0, 0.0]]
    assert union["weight"].tolist() == [[True, True, True, False]]


# --- schedule and fixed masks --------------------------------------------------------------------


def test_schedule_readjusts_every_delta_r_rounds_until_the_end() -> None:
    gate = Readjustment(alpha=0.5, every=3, end=8)
    assert [r for r in range(1, 12) if gate.due(r)] == [1, 4, 7]
    assert gate.alpha_at(4) == 0.5 and gate.alpha_at(8) == 0.0
    cosine = Readjustment(alpha=0.5, every=3, end=8, schedule="cosine")
    assert cosine.alpha_at(4) == pytest.approx(0.25)  # α/2·(1 + cos(π·4/8))
    assert not Readjustment(alpha=0.0).due(1)


def test_readjust_end_defaults_and_with_rounds() -> None:
    assert feddst.Config().with_rounds(400).readjust_end == 200
    assert feddst.Config(readjust_end=7).with_rounds(400).readjust_end == 7
    assert DEFAULT_READJUST_END == 200


def _run(
    fed: FederatedTensors, cfg: AlgorithmConfig, rounds: int, **local: object
) -> loop.RunResult:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[16])
    lc = loop.LoopConfig(
        rounds=rounds,
        clients_per_round=3,
        local=LocalConfig(**{"epochs": 1, "batch_size": 16, "lr": 0.1, **local}),  # type: ignore[arg-type]
        seed=3,
    )
    return loop.run(lc, build_algorithm(cfg), model, fed, build_compressor("none"), config_hash="t")


def _initial_masks(fed: FederatedTensors, cfg: AlgorithmConfig) -> _masks.Masks:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[16])
    state = build_algorithm(cfg).init_server(
        _params(model), RoundContext(0, torch.Generator(), 0, model)
    )
    return dict(state.masks)


@pytest.mark.parametrize(
    "cfg", [randommask.Config(), feddst.Config(alpha=0.0)], ids=["randommask", "alpha0"]
)
def test_alpha_zero_keeps_the_initial_mask(fed: FederatedTensors, cfg: AlgorithmConfig) -> None:
    res = _run(fed, cfg, rounds=4)
    init = _initial_masks(fed, cfg)
    assert all(torch.equal(res.state.server.masks[k], m) for k, m in init.items())
    assert [r[f"{cfg.name}/mask_churn"] for r in res.state.round_rows] == [0.0] * 4
    assert [r[f"{cfg.name}/readjusted"] for r in res.state.round_rows] == [0.0] * 4


def test_feddst_readjusts_on_schedule_and_keeps_the_density(fed: FederatedTensors) -> None:
    cfg = feddst.Config(alpha=0.5, readjust_every=2, readjust_end=4, grow_candidates="inactive")
    res = _run(fed, cfg, rounds=5, momentum=0.9, weight_decay=1e-3)
    rows = res.state.round_rows
    assert [r["feddst/readjusted"] for r in rows] == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert rows[0]["feddst/mask_churn"] > 0 and rows[2]["feddst/mask_churn"] > 0
    assert rows[1]["feddst/mask_churn"] == 0 and rows[4]["feddst/mask_churn"] == 0
    budgets = res.state.server.budgets
    target = sum(budgets.values()) / sum(m.numel() for m in res.state.server.masks.values())
    assert all(r["feddst/density"] == pytest.approx(target) for r in rows)
    assert {k: int(m.sum()) for k, m in res.state.server.masks.items()} == dict(budgets)


# --- communication -------------------------------------------------------------------------------


def _bits(payload: object) -> int:
    return payload.nbits().total  # type: ignore[attr-defined, no-any-return]


def test_counting_rule_through_the_payloads(fed: FederatedTensors) -> None:
    model = _mlp()
    cfg = feddst.Config(alpha=0.5, readjust_every=3)
    alg = build_algorithm(cfg)
    server = alg.init_server(_params(model), RoundContext(0, torch.Generator(), 0, model))
    n_m = sum(m.numel() for m in server.masks.values())  # 64·16 + 16·10 = 1184
    nnz = sum(server.budgets.values())
    n_b = 16 + 10  # biases
    fresh, synced = ClientState(), ClientState(server.digest)
    r1, r2 = RoundContext(1, torch.Generator()), RoundContext(2, torch.Generator())
    assert n_m == 1184
    # down, round 1: values are the seed (free), mask bits paid (clients start all ones)
    assert _bits(alg.broadcast(server, 0, fresh, r1)) == n_m
    # down later: 32·(d·N_m + B), plus N_m only if the client's mask differs from the global one
    assert _bits(alg.broadcast(server, 0, synced, r2)) == 32 * (nnz + n_b)
    assert _bits(alg.broadcast(server, 0, fresh, r2)) == 32 * (nnz + n_b) + n_m
    charged = build_algorithm(feddst.Config(free_initial_download=False))
    assert _bits(charged.broadcast(server, 0, fresh, r1)) == 32 * (nnz + n_b) + n_m

    def upload(round_: int, algorithm: object = alg) -> tuple[int, int, ClientState]:
        down = algorithm.broadcast(server, 0, fresh, RoundContext(round_, torch.Generator()))  # type: ignore[attr-defined]
        local = LocalConfig(epochs=1, batch_size=16, lr=0.1)
        ctx = ClientContext(round_, 0, model, local, torch.Generator().manual_seed(0))
        res = algorithm.client_update(down.decode(), fresh, fed.train[0], ctx)  # type: ignore[attr-defined]
        kept = sum(int(m.sum()) for m in _codec.decode(res.uplink.decode())[1].values())
        return _bits(res.uplink), kept, res.state

    # up, readjustment round (1): 32·(d_k·N_m + B) + N_m mask bits
    bits_up, kept, state = upload(1)
    assert bits_up == 32 * (kept + n_b) + n_m
    assert state.mask_digest != server.digest  # its mask moved: it pays at its next download
    # up, ordinary round (2): no mask bits; the client's mask is the global one again
    bits_up, kept, state = upload(2)
    assert bits_up == 32 * (nnz + n_b) and kept == nnz
    assert state == synced
    # the code's count of the readjusted mask: d_k·N_m bits
    code = build_algorithm(feddst.Config(alpha=0.5, upload_mask="kept"))
    bits_up, kept, _ = upload(1, code)
    assert bits_up == 32 * (kept + n_b) + kept


def test_ledger_charges_mask_bits_once_per_client_with_a_fixed_mask(fed: FederatedTensors) -> None:
    res = _run(fed, randommask.Config(), rounds=4)
    server = res.state.server
    n_m = sum(m.numel() for m in server.masks.values())
    values = 32 * (sum(server.budgets.values()) + 26)
    seen: set[int] = set()
    for round_, cid, direction, payload_bits, index_bits, meta_bits, *_ in res.ledger.rows:
        assert index_bits == meta_bits == 0
        if direction == "up":
            assert payload_bits == values
            continue
        first = cid not in seen
        seen.add(cid)
        assert payload_bits == (0 if round_ == 1 else values) + (n_m if first else 0)


def test_smoke_accuracy_rises_at_the_target_density(fed: FederatedTensors) -> None:
    cfg = feddst.Config(sparsity=0.5, alpha=0.2, readjust_every=3, readjust_end=10)
    res = _run(fed, cfg, rounds=12, momentum=0.9)
    rows = res.state.round_rows
    server = res.state.server
    target = sum(server.budgets.values()) / sum(m.numel() for m in server.masks.values())
    assert rows[-1]["global/accuracy"] > max(0.5, rows[0]["global/accuracy"])
    assert all(r["feddst/density"] <= target + 1e-9 for r in rows)
    nonzero = sum(int((server.params[k] != 0).sum()) for k in server.masks)
    assert nonzero <= sum(server.budgets.values())


def test_a_server_optimizer_is_refused_not_ignored() -> None:
    import pydantic

    with pytest.raises(pydantic.ValidationError, match="no server optimizer"):
        feddst.Config(server={"optimizer": "adam", "lr": 0.01})  # type: ignore[arg-type]


def test_masked_average_of_one_shared_mask_equals_the_general_sum_to_the_bit() -> None:
    """Clients that all kept the server's mask (the same tensor object) take the shortcut;
    the result is bit-identical to the per-client masked sums over equal but distinct masks."""
    g = torch.Generator().manual_seed(3)
    mask = torch.rand(40, 30, generator=g) < 0.7
    values = []
    for _ in range(5):
        full = torch.randn(40, 30, generator=g)
        values.append({"w": torch.where(mask, full, 0.0), "b": torch.randn(30, generator=g)})
    weights = [0.37, 1.0, 2.5, 0.1, 7.3]
    shared, shared_union = _masks.masked_average(values, [{"w": mask}] * 5, weights)
    general, general_union = _masks.masked_average(
        values, [{"w": mask.clone()} for _ in range(5)], weights
    )
    for k in general:
        assert torch.equal(shared[k], general[k]), k
    assert torch.equal(shared_union["w"], general_union["w"])


def test_encode_and_decode_by_positions_equal_boolean_indexing() -> None:
    g = torch.Generator().manual_seed(4)
    mask = torch.rand(16, 9, generator=g) < 0.5
    w = torch.randn(16, 9, generator=g)
    payload = _codec.encode({"w": w, "b": torch.ones(3)}, {"w": mask}, "sent")
    sent = payload.decode()
    assert torch.equal(sent[_codec.VALUES + "w"], w[mask])  # row-major order of the kept entries
    params, masks = _codec.decode(sent)
    assert torch.equal(params["w"], torch.where(mask, w, 0.0)) and torch.equal(masks["w"], mask)
    assert _codec.positions(mask) is _codec.positions(mask)  # found once per mask object
    assert torch.equal(_codec.positions(mask), mask.reshape(-1).nonzero().squeeze(1))
