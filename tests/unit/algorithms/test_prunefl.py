"""PruneFL against FedDST's official ``prunefl.py`` (specs/feddst-progfed.md §1(c), §1(d)): the
readjustment rule on hand examples, the p and readjustment schedules, per-entry times, phase one
(warm start, charged at round 0), masked training with a fixed mask between readjustments, and
the dense gradient upload charged only in readjustment rounds."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest
import torch
from tests.conftest import digits_federation
from torch import Tensor, nn

from fedcomm.algorithms import build_algorithm
from fedcomm.algorithms.core import (
    ClientContext,
    ClientResult,
    FedAlgorithm,
    RoundContext,
    Uplink,
    WarmStartContext,
)
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.prunefl import algorithm as prunefl
from fedcomm.algorithms.prunefl.client import ClientState, uploaded_model
from fedcomm.algorithms.prunefl.readjust import is_readjust, prune_fraction, readjust
from fedcomm.algorithms.prunefl.times import entry_times, maskable
from fedcomm.algorithms.sparse import churn
from fedcomm.algorithms.sparse.masks import apply_masks, density
from fedcomm.comm.codecs import build_compressor
from fedcomm.comm.payload import Payload
from fedcomm.models import build_model
from fedcomm.seeding import Stream, torch_generator
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors

SEED = 7
LOCAL = LocalConfig(epochs=1, batch_size=16, lr=0.05)


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _model(fed: FederatedTensors) -> nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[16])


def _warm(
    fed: FederatedTensors, **kw: object
) -> tuple[FedAlgorithm, nn.Module, prunefl.ServerState, list[tuple[int, str, Payload]]]:
    """init_server + warm_start exactly as :func:`loop.run` calls them."""
    model = _model(fed)
    alg = build_algorithm(prunefl.Config(**kw))
    gen = torch_generator(SEED, Stream.SERVER, 0)
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    state = alg.init_server(init, RoundContext(0, gen, SEED, model))
    assert alg.warm_start is not None
    state, messages = alg.warm_start(state, fed.train, WarmStartContext(gen, SEED, model, LOCAL))
    return alg, model, state, list(messages)


def _round(
    alg: FedAlgorithm,
    model: nn.Module,
    fed: FederatedTensors,
    state: prunefl.ServerState,
    cstates: dict[int, ClientState],
    round_: int,
) -> tuple[prunefl.ServerState, list[tuple[Payload, ClientResult]]]:
    """One round over clients 0, 1, 2 without the loop."""
    rctx = RoundContext(round_, torch_generator(SEED, Stream.SERVER, round_), SEED, model)
    uplinks, out = [], []
    for cid in (0, 1, 2):
        cstate = cstates.get(cid, alg.init_client(cid))
        down = alg.broadcast(state, cid, cstate, rctx)
        gen = torch_generator(SEED, Stream.CLIENT, round_, cid)
        cctx = ClientContext(round_, cid, model, LOCAL, gen, SEED)
        res = alg.client_update(down.decode(), cstate, fed.train[cid], cctx)
        cstates[cid] = res.state
        uplinks.append(Uplink(cid, res.num_examples, res.uplink.decode()))
        out.append((down, res))
    return alg.server_update(state, uplinks, rctx), out


def _run(fed: FederatedTensors, rounds: int, **kw: object) -> loop.RunResult:
    cfg = loop.LoopConfig(rounds=rounds, clients_per_round=3, local=LOCAL, seed=SEED)
    alg = build_algorithm(prunefl.Config(**kw))
    return loop.run(cfg, alg, _model(fed), fed, build_compressor("none"), config_hash="t")


def _bits(payload: Payload) -> int:
    return payload.nbits().total


def _nnz(masks: Mapping[str, Tensor]) -> int:
    return sum(int(m.sum()) for m in masks.values())


# --- the readjustment rule ---------------------------------------------------------------------

# g = a: [3, 1], b: [2, 0.5, 0, 0]  ->  g² descending: a0 9, b0 4, a1 1, b1 0.25, b2 0, b3 0
GRADS = {"a": torch.tensor([3.0, 1.0]), "b": torch.tensor([[2.0, 0.5], [0.0, 0.0]])}


def _kept(mask: Mapping[str, Tensor]) -> dict[str, list[bool]]:
    return {k: m.reshape(-1).tolist() for k, m in mask.items()}


def test_readjust_threshold_rule_with_per_layer_times() -> None:
    # p = 0.9: the floor (1 − p)·N = 0.6 forces only the first entry (a0, taken at n = 0 ≤ 0.6).
    # equal times 1, c = 0.2: b0's importance 4/1 < Σg²/(c + Σt) = 9/(0.2 + 1) = 7.5 -> stop.
    mask = readjust(GRADS, {"a": 1.0, "b": 1.0}, p=0.9, offset=0.2)
    assert _kept(mask) == {"a": [True, False], "b": [False, False, False, False]}
    # b's entries 10x cheaper: b0's importance 4/0.1 = 40 ≥ 7.5 -> kept; then a1: 1/1 < 13/1.3 = 10
    mask = readjust(GRADS, {"a": 1.0, "b": 0.1}, p=0.9, offset=0.2)
    assert _kept(mask) == {"a": [True, False], "b": [True, False, False, False]}
    assert mask["b"].shape == (2, 2)


def test_readjust_floor_keeps_more_than_one_minus_p_of_the_entries() -> None:
    # the code's `n_grown <= n_required`: entries are taken while at most (1 − p)·N are kept,
    # so ⌊(1 − p)·N⌋ + 1 are: p = 0.5 -> 3.0 -> 4 kept (a0, b0, a1, b1), though the threshold
    # alone would stop after a0 (as above)
    mask = readjust(GRADS, {"a": 1.0, "b": 1.0}, p=0.5, offset=0.2)
    assert _kept(mask) == {"a": [True, True], "b": [True, True, False, False]}
    # p = 0.3 -> 4.2 -> 5 kept: the next in order is b2 (a zero gradient; ties in index order)
    mask = readjust(GRADS, {"a": 1.0, "b": 1.0}, p=0.3, offset=0.2)
    assert _kept(mask) == {"a": [True, True], "b": [True, True, True, False]}
    assert _nnz(readjust(GRADS, {"a": 1.0, "b": 1.0}, p=0.0, offset=0.2)) == 6


def test_readjust_keeps_every_entry_whose_importance_passes_the_threshold() -> None:
    # equal g² = 1 and t = 1: entry n passes since 1 ≥ n/(0.2 + n), so even p = 1 keeps all
    grads = {"a": torch.ones(5), "b": -torch.ones(3)}
    assert _nnz(readjust(grads, {"a": 1.0, "b": 1.0}, p=1.0, offset=0.2)) == 8
    # with c = 0 the ratio is reached exactly (1 ≥ n/n): still all kept, no 0/0 at n = 0
    assert _nnz(readjust(grads, {"a": 1.0, "b": 1.0}, p=1.0, offset=0.0)) == 8


def test_churn_is_the_fraction_of_flipped_mask_bits() -> None:
    old = {"a": torch.tensor([True, True]), "b": torch.tensor([False, False])}
    new = {"a": torch.tensor([True, False]), "b": torch.tensor([True, False])}
    assert churn(old, new) == 0.5


# --- schedules and times -----------------------------------------------------------------------


def test_prune_fraction_halves_at_each_federated_readjustment() -> None:
    cfg = prunefl.Config()
    assert cfg.p_initial == 0.3
    fractions = [prune_fraction(cfg, j, 2 + 50 * (j - 1)) for j in (1, 2, 3)]
    assert fractions == pytest.approx([0.15, 0.075, 0.0375])  # 0.3·0.5^j
    code = prunefl.Config(p_exponent="round")  # 0.3·0.5^server_round (0-based round)
    assert prune_fraction(code, 1, 2) == pytest.approx(0.15)
    assert prune_fraction(code, 2, 52) == pytest.approx(0.3 * 0.5**51)


def test_readjustment_rounds() -> None:
    assert [r for r in range(1, 120) if is_readjust(r, 2, 50)] == [2, 52, 102]
    assert [r for r in range(1, 8) if is_readjust(r, 1, 3)] == [1, 4, 7]


def test_entry_times(fed: FederatedTensors) -> None:
    mlp = _model(fed)
    uniform = entry_times(mlp, "uniform", None)
    assert uniform == pytest.approx({"fc1.weight": 1 / 1184, "fc2.weight": 1 / 1184})
    cnn = build_model("mnist_cnn", input_shape=(1, 8, 8), num_classes=10)
    assert maskable(cnn) == ["conv1.weight", "conv2.weight", "fc1.weight", "fc2.weight"]
    flops = entry_times(cnn, "flops", fed.train[0].x[0])
    sizes = {n: p.numel() for n, p in cnn.named_parameters()}
    assert sum(flops[n] * sizes[n] for n in flops) == pytest.approx(1.0)  # dense model: time 1
    # padding 2 keeps 8x8 for conv1 (64 positions), 4x4 after one pool for conv2, 1 for linear
    assert flops["conv1.weight"] / flops["fc1.weight"] == pytest.approx(64.0)
    assert flops["conv2.weight"] / flops["fc2.weight"] == pytest.approx(16.0)
    assert entry_times(mlp, [2.0, 3.0], None) == {"fc1.weight": 2.0, "fc2.weight": 3.0}
    with pytest.raises(ValueError, match="2 layers"):
        entry_times(mlp, [1.0], None)


# --- phase one ---------------------------------------------------------------------------------


def test_warm_start_prunes_on_one_client_and_charges_round_zero(fed: FederatedTensors) -> None:
    _, _, state, messages = _warm(fed)
    n_m = 64 * 16 + 16 * 10  # fc1, fc2 weights
    biases = 16 + 10
    assert state.phase_one_rounds == 5  # no early stop with a single readjustment (round 2)
    dens = density(state.masks)
    assert 0.7 <= dens < 1.0 and state.mask_version == 1
    for name, m in state.masks.items():
        assert torch.all(state.params[name][~m] == 0)
    [(cid, direction, payload)] = messages
    assert direction == "up" and 0 <= cid < fed.num_clients
    assert _bits(payload) == 32 * _nnz(state.masks) + n_m + 32 * biases  # values, mask, biases
    # the loop charges exactly that message as round 0, and starts from that model
    res = _run(fed, rounds=1)
    rows = [r for r in res.ledger.rows if r[0] == 0]
    bits_ = _bits(payload)
    assert rows == [(0, cid, "up", bits_, 0, 0, payload.dense_bits(), "sent", bits_, 0)]
    assert res.state.round_rows[0]["prunefl/mask_density"] == pytest.approx(dens)
    assert res.state.round_rows[0]["prunefl/phase_one_rounds"] == 5


def test_phase_one_stops_after_consecutive_small_changes(fed: FederatedTensors) -> None:
    # every change is < 100 %: with patience 2 and readjustments at local rounds 2, 3, … it stops
    # after round 3
    kw = {"initial_rounds": 10, "initial_readjust_every": 1, "early_stop_patience": 2}
    _, _, state, _ = _warm(fed, early_stop_churn=1.0, **kw)
    assert state.phase_one_rounds == 3
    _, _, state, _ = _warm(fed, early_stop_churn=1e-9, **kw)  # never small enough
    assert state.phase_one_rounds == 10


def test_no_phase_one_keeps_the_dense_mask(fed: FederatedTensors) -> None:
    _, _, state, messages = _warm(fed, initial_rounds=0)
    assert messages == [] and density(state.masks) == 1.0 and state.mask_version == 0


# --- federated phase ---------------------------------------------------------------------------


def test_download_charges_the_mask_only_when_the_client_lacks_it(fed: FederatedTensors) -> None:
    alg, model, state, _ = _warm(fed)
    rctx = RoundContext(1, torch.Generator(), SEED, model)
    stale = alg.broadcast(state, 0, ClientState(0), rctx)
    fresh = alg.broadcast(state, 0, ClientState(state.mask_version), rctx)
    values = 32 * _nnz(state.masks) + 32 * (16 + 10)
    assert _bits(fresh) == values
    assert _bits(stale) == values + sum(m.numel() for m in state.masks.values())


def test_mask_is_fixed_between_readjustments_and_training_respects_it(
    fed: FederatedTensors,
) -> None:
    alg, model, state, _ = _warm(fed, readjust_every=3)  # federated readjustments: rounds 2, 5
    cstates: dict[int, ClientState] = {}
    masks = [state.masks]
    for r in range(1, 6):
        before = state
        state, results = _round(alg, model, fed, state, cstates, r)
        for down, res in results:
            for name, m in before.masks.items():  # clients train only active weights
                assert torch.all(res.local_params[name][~m] == 0)
            got = uploaded_model(down.decode(), res.uplink.decode())
            assert all(torch.allclose(got[k], res.local_params[k]) for k in got)
        metrics = alg.server_metrics(state)
        assert ("mask_churn" in metrics) == (r in (2, 5))
        masks.append(state.masks)
    same = [all(torch.equal(a[k], b[k]) for k in a) for a, b in itertools.pairwise(masks)]
    assert same[0] and same[2] and same[3]  # rounds 1, 3, 4 never change the mask
    assert not same[1] and not same[4]  # p = 0.15, 0.075: the mask grows at rounds 2 and 5
    assert state.readjustments == 2 and state.mask_version == 3
    assert density(masks[2]) < density(masks[5])
    for name, m in state.masks.items():
        assert torch.all(state.params[name][~m] == 0)


def test_dense_gradient_upload_only_in_readjustment_rounds(fed: FederatedTensors) -> None:
    _, _, warm, _ = _warm(fed)
    n_m, biases = 64 * 16 + 16 * 10, 16 + 10
    res = _run(fed, rounds=4, readjust_every=2)  # readjustments at rounds 2 and 4
    up = {
        r: [
            row[3] + row[4] + row[5]
            for row in res.ledger.rows
            if row[:1] == (r,) and row[2] == "up"
        ]
        for r in (1, 2, 3, 4)
    }
    values = 32 * _nnz(warm.masks) + 32 * biases  # round 1: active values of the phase-one mask
    assert up[1] == [values] * 3
    assert up[2] == [values + 32 * n_m] * 3  # same mask, plus 32 bits per maskable entry
    assert len(set(up[3])) == 1 and up[4] == [up[3][0] + 32 * n_m] * 3
    assert up[3][0] > values  # the round-2 readjustment (p = 0.15) grew the mask
    rows = res.state.round_rows
    assert [("prunefl/mask_churn" in row) for row in rows] == [False, True, False, True]
    assert rows[1]["prunefl/prune_fraction"] == pytest.approx(0.15)


def test_server_averages_active_values_and_readjusts_from_mean_gradients() -> None:
    model = nn.Linear(3, 1)
    alg = build_algorithm(prunefl.Config(p_federated=1.0, p_decay=1.0))  # p = 1 at readjustments
    params = {"weight": torch.tensor([[1.0, 2.0, 3.0]]), "bias": torch.tensor([0.5])}
    state = alg.init_server(params, RoundContext(0, torch.Generator(), 0, model))
    mask = {"weight": torch.tensor([[True, False, True]])}
    state = prunefl.ServerState(apply_masks(params, mask), state.opt_state, mask, state.times)

    def up(cid: int, n: int, w: list[float], b: float, g: list[float] | None) -> Uplink:
        t = {"w/weight": torch.tensor(w), "w/bias": torch.tensor([b])}
        return Uplink(cid, n, t if g is None else t | {"grad/weight": torch.tensor([g])})

    ctx = RoundContext(1, torch.Generator(), 0, model)
    one = alg.server_update(
        state, [up(0, 1, [0.3, 0.6], 1.0, None), up(1, 3, [-0.1, 0.2], 0.2, None)], ctx
    )
    # active entries: 1 + (1·0.3 + 3·(−0.1))/4 = 1.0, 3 + (1·0.6 + 3·0.2)/4 = 3.3; the bias
    # 0.5 + (1·1.0 + 3·0.2)/4 = 0.9; the masked-out entry stays 0
    assert one.params["weight"][0].tolist() == pytest.approx([1.0, 0.0, 3.3])
    assert one.params["bias"].tolist() == pytest.approx([0.9])
    assert torch.equal(one.masks["weight"], mask["weight"]) and one.churn is None
    # round 2 readjusts from the unweighted mean gradient [2, 0, 1] (weighted by n it would be
    # [1, 0, 1.5]) -> g² [4, 0, 1], t = 1/3 each, c = 0.2: keep entry 0 (n = 0 ≤ (1 − p)·N = 0),
    # then entry 2: 1/(1/3) = 3 < 4/(0.2 + 1/3) = 7.5 -> stop
    ctx = RoundContext(2, torch.Generator(), 0, model)
    grads = [up(0, 1, [0.0, 0.0], 0.0, [4.0, 0.0, 0.0]), up(1, 3, [0.0, 0.0], 0.0, [0.0, 0.0, 2.0])]
    two = alg.server_update(state, grads, ctx)
    assert two.masks["weight"].tolist() == [[True, False, False]]
    assert two.params["weight"][0].tolist() == pytest.approx([1.0, 0.0, 0.0])
    assert two.churn == pytest.approx(1 / 3) and two.p == 1.0
    assert two.mask_version == state.mask_version + 1 and two.readjustments == 1


def test_accuracy_rises(fed: FederatedTensors) -> None:
    res = _run(fed, rounds=8, readjust_every=3)
    acc = [row["global/accuracy"] for row in res.state.round_rows]
    assert acc[-1] > acc[0] + 0.05
