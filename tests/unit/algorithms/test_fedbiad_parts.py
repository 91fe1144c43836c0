"""FedBIAD's helper modules on their own: the selection rules in the sub-model family's shape and
stage one's check (``fedbiad.rows``), the local step's hooks (``fedbiad.bayes``) and the
server's model check and reconstruction (``fedbiad.server``)."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn

from fedcomm.algorithms.core import Uplink
from fedcomm.algorithms.fedbiad import bayes, server
from fedcomm.algorithms.fedbiad import rows as rows_
from fedcomm.algorithms.submodel.units import keep_ranked, score_ranking
from fedcomm.models import build_model


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, hidden=[12, 6])


def test_stage_two_is_the_top_rows_of_each_layer_drawn_in_layer_order() -> None:
    specs = rows_.row_specs(_mlp(), drop_output_layer=True)
    scores = {s.name: torch.randint(0, 3, (s.count,)).float() for s in specs}
    keep = rows_.keep_counts(specs, 0.5)
    g = torch.Generator().manual_seed(3)
    got = {name: rows_.top_rows(scores[name], k, g) for name, k in keep.items()}
    want = rows_.score_pattern(specs, scores, 0.5, torch.Generator().manual_seed(3))
    assert got.keys() == want.keys()
    for name, mask in got.items():
        assert torch.equal(mask, want[name]) and int(mask.sum()) == keep[name]
        kept_min = scores[name][mask].min()
        assert bool((scores[name][~mask] <= kept_min).all())  # the top rows, by score


def test_score_ranking_orders_by_score_and_keep_ranked_keeps_its_head() -> None:
    scores = torch.tensor([0.0, 5.0, 1.0, 5.0, 3.0])
    ranking = score_ranking(scores, torch.Generator().manual_seed(0))
    assert sorted(ranking.tolist()) == [0, 1, 2, 3, 4]
    assert scores[ranking].tolist() == [5.0, 5.0, 3.0, 1.0, 0.0]
    assert keep_ranked(ranking, 3, 5).tolist() == [False, True, False, True, True]
    seen = {
        tuple(score_ranking(scores, torch.Generator().manual_seed(s))[:2].tolist())
        for s in range(20)
    }
    assert seen == {(1, 3), (3, 1)}  # the tie at 5 broken both ways


def test_initial_scores_copies_held_scores_and_zero_fills_new_layers() -> None:
    specs = rows_.row_specs(_mlp(), drop_output_layer=True)
    held = {specs[0].name: torch.arange(specs[0].count).float()}
    got = rows_.initial_scores(specs, held)
    assert torch.equal(got[specs[0].name], held[specs[0].name])
    assert got[specs[0].name] is not held[specs[0].name]  # a copy: E is updated in place later
    assert all(float(got[s.name].abs().sum()) == 0 for s in specs[1:])


def test_perturbed_params_and_frozen_rows() -> None:
    full = {
        "w": torch.ones(2, 3),
        "b": torch.ones(2),
        bayes.EPS + "w": torch.full((2, 3), 2.0),
        bayes.EPS + "b": torch.full((2,), 2.0),
        bayes.ROW + "w": torch.tensor([[1.0], [0.0]]).expand(2, 3),
        bayes.S_TILDE: torch.tensor(0.5),
    }
    out = bayes.perturbed_params(["w", "b"], full)  # β ∘ (U + s̃ε)
    assert out["w"].tolist() == [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]
    assert out["b"].tolist() == [2.0, 2.0]  # no row mask: perturbed, never dropped
    live = {"w": torch.full((2, 3), 7.0), "b": torch.full((2,), 7.0)}
    kept = bayes.frozen_rows(live, full, {"w": torch.zeros(2, 3), "b": torch.zeros(2)})
    assert kept["w"].tolist() == [[7.0] * 3, [0.0] * 3] and kept["b"].tolist() == [7.0, 7.0]


def test_check_model_needs_a_sequential_model_for_holders() -> None:
    lstm = build_model("lstm", input_shape=(5,), num_classes=20, embed_dim=8, hidden=8)
    server.check_model("all", lstm)
    server.check_model("holders", _mlp())
    with pytest.raises(ValueError, match="next_columns 'holders' needs a sequential model"):
        server.check_model("holders", lstm)


def test_reconstruct_inverts_encode_upload() -> None:
    model = _mlp()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    specs = rows_.row_specs(model, drop_output_layer=True)
    beta = rows_.random_pattern(specs, 0.5, torch.Generator().manual_seed(1))
    update = {k: torch.randn_like(t) for k, t in params.items()}
    up = Uplink(0, 4, server.encode_upload(update, specs, beta).decode())
    values, masks = server.reconstruct(up, params, specs, model, holders=False)
    for k, t in params.items():  # β ∘ (U_{r−1} + Δ): zeros on dropped rows
        want = t + update[k]
        assert torch.equal(values[k], torch.where(masks[k], want, 0.0) if k in masks else want)
    assert torch.equal(masks[specs[0].members[0][0]][:, 0], beta[specs[0].name])


def test_stage_one_check_resamples_on_a_rising_trend_and_scores_at_check_points() -> None:
    model = _mlp()
    like = {k: p.detach() for k, p in model.named_parameters()}
    specs = rows_.row_specs(model, drop_output_layer=True)
    gen = torch.Generator().manual_seed(0)
    beta0 = rows_.random_pattern(specs, 0.5, gen)
    track = rows_.Track(beta0, rows_.initial_scores(specs, {}))
    check = partial(rows_.stage_one_check, specs, 0.5, 2, "layer", gen, like, track)
    step = partial(check, live={}, frozen={}, idx=torch.zeros(0))
    assert [step(v, loss) for v, loss in enumerate([1.0, 1.0, 1.0, 2.0])] == [None] * 4
    live, masks = step(4, 2.0)  # v = 2τ: ΔL = mean(2, 2) − mean(1, 1) > 0 (Eq. 8)
    assert live == {} and track.resamples == 1 and track.beta is not beta0
    assert masks.keys() == bayes.row_masks(specs, track.beta, like).keys()
    for s in specs:  # Eq. 9: a row held before gains 1 iff it is held after the resample
        want = (beta0[s.name] & track.beta[s.name]).float()
        assert torch.equal(track.scores[s.name], want)
    beta1 = track.beta
    assert step(5, 1.0) is None
    assert step(6, 0.5) is not None  # ΔL = mean(1, 0.5) − mean(2, 2) ≤ 0: β kept
    assert track.beta is beta1 and track.resamples == 1
    for s in specs:  # every row held now gains 1
        want = (beta0[s.name] & beta1[s.name]).float() + beta1[s.name].float()
        assert torch.equal(track.scores[s.name], want)
