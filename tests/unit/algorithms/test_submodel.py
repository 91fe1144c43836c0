"""The sub-model family's composable pieces (algorithms/submodel/): each selection rule's
contract (exact keep counts, determinism from its generator, what it ranks first), the codec's
round trip and bits, each aggregation on a hand-sized example, and the composition's server step
applied only where some client held the entry."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
from torch import Tensor, nn

from fedcomm.algorithms import afd, feddrop, fedmp, submodel
from fedcomm.algorithms.core import ClientContext, ClientData, RoundContext, Uplink
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import sequential as _sequential
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.fedbiad import rows as fedbiad_rows
from fedcomm.algorithms.submodel.codec import decode_kept, encode, keep_masks, uploaded_model
from fedcomm.algorithms.submodel.merge import (
    aggregate,
    masked_mean,
    nested,
    nested_aggregate,
    recovered_mean,
)
from fedcomm.algorithms.submodel.units import (
    Rank,
    drop_counts,
    first_units,
    keep_counts,
    keep_ranked,
    param_masks,
    select,
    slice_masks,
    unit_layers,
    width_counts,
)
from fedcomm.comm.payload import Free, Mask, Meta, Payload
from fedcomm.models import build_model
from fedcomm.models.groups import GroupSpec
from fedcomm.seeding import Stream, torch_generator
from fedcomm.server_opt import ServerOptConfig


def _mlp(hidden: list[int]) -> nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=hidden)


def _params(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# --- selection rules --------------------------------------------------------------------------


def test_select_keeps_the_first_n_of_each_ranking_in_layer_order() -> None:
    layers = unit_layers(_mlp([6, 4]))
    calls: list[tuple[str, int]] = []

    def reversed_order(spec: GroupSpec, n_keep: int) -> Tensor:
        calls.append((spec.name, n_keep))
        return torch.arange(spec.count).flip(0)

    keep = select(layers, {"fc1": 2, "fc2": 3, "fc3": 10}, reversed_order)
    assert calls == [("fc1", 2), ("fc2", 3), ("fc3", 10)]
    assert keep["fc1"].tolist() == [False] * 4 + [True] * 2
    assert keep["fc2"].tolist() == [False, True, True, True]
    assert bool(keep["fc3"].all())
    # a partial ranking is enough: only its first n_keep entries are read
    assert keep_ranked(torch.tensor([4, 0, 2]), 2, 5).tolist() == [True, False, False, False, True]


def test_random_rule_drops_the_first_units_of_the_clients_permutation() -> None:
    layers = unit_layers(_mlp([40, 20]))
    counts = drop_counts(layers, conv_rate=0.1, fc_rate=0.3, drop_output=False)
    keep = feddrop.select_units(layers, counts, seed=3, round_=5, client_id=2)
    g = torch_generator(3, Stream.ALGORITHM, 5, 2)  # replayed: one permutation per layer, in order
    for spec in layers:
        dropped = torch.randperm(spec.count, generator=g)[: counts[spec.name]]
        want = torch.ones(spec.count, dtype=torch.bool)
        want[dropped] = False
        assert torch.equal(keep[spec.name], want)
        assert int(keep[spec.name].sum()) == spec.count - counts[spec.name]


def test_loss_adaptive_rule_ranks_positive_scores_first_then_tops_up_uniformly() -> None:
    scores = torch.tensor([0.0, 0.5, 0.0, 0.25, 0.0, 0.0])
    for seed in range(20):
        ranking = afd.weighted_rank(scores, 4, torch.Generator().manual_seed(seed))
        assert len(set(ranking.tolist())) == 4  # exactly n_keep distinct units
        assert set(ranking[:2].tolist()) == {1, 3}  # the positive scores before any top-up
        again = afd.weighted_rank(scores, 4, torch.Generator().manual_seed(seed))
        assert torch.equal(ranking, again)  # determined by the generator
    # one unit out of scores 1 : 3 is drawn in proportion to its score
    g = torch.Generator().manual_seed(0)
    draws = [int(afd.weighted_rank(torch.tensor([1.0, 3.0]), 1, g)[0]) for _ in range(2000)]
    assert sum(draws) / len(draws) == pytest.approx(0.75, abs=0.04)
    # all-zero scores: a uniformly random sub-model of the exact size
    tops = [int(afd.weighted_rank(torch.zeros(4), 1, g)[0]) for _ in range(2000)]
    assert all(tops.count(i) / 2000 == pytest.approx(0.25, abs=0.04) for i in range(4))


def test_l1_rule_keeps_the_largest_units_and_prunes_the_lower_index_of_a_tie() -> None:
    layers = unit_layers(_mlp([4]))
    params = _params(_mlp([4]))
    params["fc1.weight"] = torch.zeros(4, 64)
    params["fc1.bias"] = torch.tensor([2.0, -1.0, 3.0, 1.0])  # L1: 2, 1, 3, 1
    keep = fedmp.prune_units(layers, params, p=0.5)  # round(0.5·4) = 2 pruned
    assert keep["fc1"].tolist() == [True, False, True, False]
    keep = fedmp.prune_units(layers, params, p=0.25)  # 1 pruned: the tie's lower index
    assert keep["fc1"].tolist() == [True, False, True, True]
    assert bool(keep["fc2"].all())  # the output layer stays full
    assert keep_counts(layers, 0.25) == {"fc1": 3, "fc2": 10}


def test_ordered_rule_is_a_nested_prefix_with_ceil_counts_and_a_full_output() -> None:
    model = _mlp([10, 3])
    layers, params = unit_layers(model), _params(model)
    assert width_counts(layers, 0.7) == {"fc1": 7, "fc2": 3, "fc3": 10}  # 0.7·10 -> 7, not 8
    keep = first_units(layers, 0.5)
    assert keep["fc1"].tolist() == [True] * 5 + [False] * 5
    assert keep["fc2"].tolist() == [True, True, False]  # ceil(1.5)
    assert bool(keep["fc3"].all())
    small, large = slice_masks(layers, 0.3, params), slice_masks(layers, 0.5, params)
    assert all(bool((small[k] <= large[k]).all()) for k in params)  # nested
    assert small["fc2.weight"][:, 3:].sum() == 0  # fc2 reads only the kept fc1 units


def test_a_score_ranked_rule_plugs_in_like_fedbiads_stage_two() -> None:
    layers = unit_layers(_mlp([12, 6]))
    g = torch.Generator().manual_seed(1)
    scores = {s.name: torch.randint(0, 3, (s.count,), generator=g).float() for s in layers}

    def by_score(gen: torch.Generator) -> Rank:
        def rank(spec: GroupSpec, n_keep: int) -> Tensor:  # ties in random order
            perm = torch.randperm(spec.count, generator=gen)
            return perm[torch.sort(scores[spec.name][perm], descending=True, stable=True).indices]

        return rank

    keep = select(layers, fedbiad_rows.keep_counts(layers, 0.5), by_score(torch_generator(0, 1)))
    want = fedbiad_rows.score_pattern(layers, scores, 0.5, torch_generator(0, 1))
    assert all(torch.equal(keep[k], want[k]) for k in want)


# --- codec ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "unit_bits"), [(None, 0), (Free, 0), (Mask, 6 + 3)])
def test_codec_round_trip_and_bits(pattern: type[Free] | type[Mask] | None, unit_bits: int) -> None:
    model = _mlp([6, 3])
    layers, params = unit_layers(model), _params(model)
    keep = {"fc1": torch.tensor([1, 0, 1, 1, 0, 0]).bool(), "fc2": torch.tensor([0, 1, 1]).bool()}
    keep["fc3"] = torch.ones(10, dtype=torch.bool)
    message = Payload(encode(params, layers, keep, pattern))
    masks = param_masks(layers, keep, params)
    kept = sum(int(m.sum()) for m in masks.values())
    assert kept == 3 * 64 + 3 + 2 * 3 + 2 + 10 * 2 + 10  # rows, the columns they read, biases
    assert message.nbits().total == 32 * kept + unit_bits
    assert ("unit/fc1" in message) == (pattern is not None) and "unit/fc3" not in message
    decoded = message.decode()
    assert all(torch.equal(keep_masks(decoded)[k], masks[k]) for k in params)
    sub = decode_kept(decoded)
    assert all(torch.equal(sub[k], params[k] * masks[k]) for k in params)
    # an upload of deltas on the same entries stands for the download plus the delta
    up = Payload(encode({k: torch.ones_like(v) for k, v in params.items()}, layers, keep))
    rebuilt = uploaded_model(decoded, up.decode())
    assert all(torch.equal(rebuilt[k], sub[k] + masks[k].float()) for k in params)


# --- aggregations -----------------------------------------------------------------------------


def _two_clients() -> tuple[list[dict[str, Tensor]], list[dict[str, Tensor]], list[float]]:
    deltas = [{"w": torch.tensor([1.0, 2.0, 0.0])}, {"w": torch.tensor([3.0, 0.0, 0.0])}]
    masks = [{"w": torch.tensor([True, True, False])}, {"w": torch.tensor([True, False, False])}]
    return deltas, masks, [1.0, 3.0]


def test_held_and_all_means_divide_by_the_holders_or_by_everyone() -> None:
    deltas, masks, weights = _two_clients()
    held_delta, held = aggregate(deltas, masks, weights, "held")
    assert held_delta["w"].tolist() == [2.5, 2.0, 0.0]  # (1 + 3·3) / 4; 2 / 1; nobody
    assert held["w"].tolist() == [True, True, False]
    all_delta, held_all = masked_mean("all")(deltas, masks, weights, None)
    assert all_delta["w"].tolist() == [2.5, 0.5, 0.0]  # 2 / 4 at the second entry
    assert torch.equal(held_all["w"], held["w"])


def test_r2sp_is_the_mean_of_the_recovered_models_held_everywhere() -> None:
    deltas, masks, weights = _two_clients()
    glob = {"w": torch.tensor([10.0, 20.0, 30.0])}
    delta, held = recovered_mean(deltas, masks, weights, None)
    subs = [{"w": glob["w"] + d["w"]} for d in deltas]
    want = fedmp.r2sp(glob, subs, masks, weights)
    assert torch.equal(glob["w"] + delta["w"], want["w"])
    assert delta["w"].tolist() == [2.5, 0.5, 0.0]
    assert bool(held["w"].all())


def test_nested_mean_averages_each_level_block_over_the_clients_covering_the_level() -> None:
    levels = [{"w": torch.tensor([True, False, False, False])}]
    levels.append({"w": torch.tensor([True, True, True, False])})
    deltas = [{"w": torch.tensor([1.0, 2.0, 4.0, 0.0])}, {"w": torch.tensor([3.0, 6.0, 0.0, 0.0])}]
    # client 1 holds part of level 2's block (entry 1) but not the whole level: it only counts
    # on level 1's block
    masks = [{"w": torch.tensor([True, True, True, False])}]
    masks.append({"w": torch.tensor([True, True, False, False])})
    delta, covered = nested_aggregate(deltas, masks, [1.0, 3.0], levels)
    assert delta["w"].tolist() == [2.5, 2.0, 4.0, 0.0]
    assert covered["w"].tolist() == [True, True, True, False]


def test_nested_over_the_models_width_slices() -> None:
    model = _mlp([10])
    layers, params = unit_layers(model), _params(model)

    class State:
        def __init__(self) -> None:
            self.params, self.layers = params, layers

    half, full = slice_masks(layers, 0.5, params), slice_masks(layers, 1.0, params)
    deltas = [{k: half[k] * torch.ones_like(v) for k, v in params.items()}]
    deltas.append({k: 3 * torch.ones_like(v) for k, v in params.items()})
    delta, covered = nested([0.5, 1.0])(deltas, [half, full], [1.0, 1.0], State())
    assert delta["fc1.weight"][:5].unique().tolist() == [2.0]  # both clients cover the half
    assert delta["fc1.weight"][5:].unique().tolist() == [3.0]  # only the full-width client
    assert all(bool(c.all()) for c in covered.values())


# --- the composition --------------------------------------------------------------------------


def test_the_server_step_moves_only_entries_some_client_held() -> None:
    model = _mlp([4])
    params = _params(model)
    cfg = feddrop.Config(server=ServerOptConfig(optimizer="momentum", lr=1.0, momentum=0.5))
    widths = iter([1.0, 0.5])  # round 1 holds everything, round 2 the first half of fc1
    updates: list[list[float]] = []

    def keep(state: submodel.ServerState, client_id: int, ctx: RoundContext) -> dict[str, Tensor]:
        return first_units(state.layers, width)

    def update(
        state: submodel.ServerState, ups: list[Uplink], weights: list[float], ctx: RoundContext
    ) -> submodel.ServerState:
        updates.append(weights)
        return state

    alg = submodel.algorithm(
        cfg, submodel.Selection(keep, update=update), masked_mean("held"), weighting="uniform"
    )
    rctx = RoundContext(1, torch.Generator(), 0, model)
    states = [alg.init_server(params, rctx)]
    for width in widths:
        down = alg.broadcast(states[-1], 0, None, rctx).decode()
        ones = {k: torch.ones_like(v) for k, v in decode_kept(down).items()}
        up = Payload(encode(ones, states[-1].layers, first_units(states[-1].layers, width)))
        states.append(alg.server_update(states[-1], [Uplink(0, 5, up.decode())], rctx))
    w0, w1, w2 = (s.params["fc1.weight"] for s in states)
    torch.testing.assert_close(w1, w0 + 1.0)  # round 1: Δ = 1 everywhere
    torch.testing.assert_close(w2[:2], w1[:2] + 1.5)  # round 2, held: m = 0.5·1 + 1
    assert torch.equal(w2[2:], w1[2:])  # not held: untouched, though the momentum is 0.5
    assert updates == [[1.0], [1.0]]


def test_masked_client_trains_the_sub_model_and_reports_its_fraction() -> None:
    model = _mlp([4])
    layers, params = unit_layers(model), _params(model)
    keep = {"fc1": torch.tensor([True, False, True, False]), "fc2": torch.ones(10).bool()}
    down = Payload(encode(params, layers, keep)).decode()
    g = torch.Generator().manual_seed(0)
    data = ClientData(
        torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
    )
    ctx = ClientContext(1, 0, model, LocalConfig(steps=3, batch_size=8), g)

    def loss(res: _jobs.JobResult) -> dict[str, Meta]:
        return {"x/loss": Meta(torch.tensor(res.loss))}

    job = submodel.masked_client("x", meta=loss)(down, None, data, ctx)
    res = _sequential.run_job(job, model, ctx.local)
    masks = keep_masks(down)
    kept = sum(int(m.sum()) for m in masks.values())
    assert res.metrics["x/submodel_fraction"] == kept / sum(m.numel() for m in masks.values())
    assert list(res.uplink)[-1] == "x/loss"
    trained: Mapping[str, Tensor] = res.local_params
    assert all(bool((trained[k][~m] == 0).all()) for k, m in masks.items())  # dropped stay 0
    assert not torch.equal(trained["fc1.weight"][0], params["fc1.weight"][0])  # kept ones train
