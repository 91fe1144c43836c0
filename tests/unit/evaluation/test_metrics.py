"""Golden-value tests of evaluation.metrics on hand-set tiny models."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedcomm.evaluation.metrics import (
    accuracy_from_logits,
    evaluate,
    topk_correct,
    weighted_mean,
)


def _linear() -> tuple[nn.Linear, dict[str, torch.Tensor]]:
    """Linear 2 -> 3 with W = [[1, 0], [0, 1], [-1, -1]], b = 0 (given as params, not in-module)."""
    model = nn.Linear(2, 3)
    params = {
        "weight": torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, -1.0]]),
        "bias": torch.zeros(3),
    }
    return model, params


# logits: x=[2,0] -> [2, 0, -2]; x=[0,1] -> [0, 1, -1]; x=[-1,-1] -> [-1, -1, 2]
X = torch.tensor([[2.0, 0.0], [0.0, 1.0], [-1.0, -1.0]])
Y = torch.tensor([0, 0, 2])  # arg-max 0 (hit), 1 (miss: target ranks 2nd), 2 (hit)


def test_evaluate_linear_golden() -> None:
    model, params = _linear()
    res = evaluate(model, params, X, Y, topk=(1, 2, 3))
    # CE = -logit_y + log sum exp(logits), per row, then mean over 3 rows
    expected = (
        (-2 + math.log(math.e**2 + 1 + math.e**-2))
        + (0 + math.log(1 + math.e + math.e**-1))
        + (-2 + math.log(2 * math.e**-1 + math.e**2))
    ) / 3
    assert res.n == 3
    assert res.loss == pytest.approx(expected, rel=1e-6)
    assert res.accuracy == pytest.approx(2 / 3)
    assert res.topk == pytest.approx({1: 2 / 3, 2: 1.0, 3: 1.0})


def test_evaluate_uses_given_params_not_module_weights() -> None:
    model, params = _linear()
    with torch.no_grad():
        model.weight.zero_()
    assert evaluate(model, params, X, Y).accuracy == pytest.approx(2 / 3)


def test_evaluate_restores_training_mode() -> None:
    model, params = _linear()
    model.train()
    evaluate(model, params, X, Y)
    assert model.training


def test_batching_matches_one_batch() -> None:
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 4))
    params = dict(model.named_parameters())
    x = torch.randn(23, 5, generator=gen)
    y = torch.randint(0, 4, (23,), generator=gen)
    whole = evaluate(model, params, x, y, topk=(2,))
    batched = evaluate(model, params, x, y, batch_size=4, topk=(2,))
    assert batched.n == whole.n == 23
    assert batched.loss == pytest.approx(whole.loss, rel=1e-6)
    assert batched.accuracy == whole.accuracy
    assert batched.topk == whole.topk


class _TokenScorer(nn.Module):
    """(B, T) token ids -> (B, T, V) logits = table[token]."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.zeros(3, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.table[x]


def test_sequence_logits_count_tokens() -> None:
    model = _TokenScorer()
    # token t scores class (t + 1) % 3 highest, then t: a next-token "successor" rule
    table = torch.tensor([[1.0, 3.0, 0.0], [0.0, 1.0, 3.0], [3.0, 0.0, 1.0]])
    x = torch.tensor([[0, 1, 2], [2, 2, 0]])  # (B=2, T=3)
    y = torch.tensor([[1, 2, 2], [0, 2, 0]])  # top-1 hits: 1,1,0 / 1,0,0 -> 3 of 6
    res = evaluate(model, {"table": table}, x, y, topk=(2,))
    # top-2 of token t is {(t+1)%3, t}, and every target above is one of those two: 6 of 6
    assert res.n == 6
    assert res.accuracy == pytest.approx(3 / 6)
    assert res.topk[2] == pytest.approx(1.0)
    # loss per token: -logit_y + log(e^3 + e^1 + e^0); 3 tokens have logit_y = 3, 3 have 1
    lse = math.log(math.e**3 + math.e + 1)
    assert res.loss == pytest.approx(((lse - 3) * 3 + (lse - 1) * 3) / 6, rel=1e-6)


def test_ignore_index_drops_padding_tokens() -> None:
    table = torch.tensor([[1.0, 3.0, 0.0], [0.0, 1.0, 3.0], [3.0, 0.0, 1.0]])
    x = torch.tensor([[0, 1, 2]])
    y = torch.tensor([[1, -100, 1]])  # hit, padding, miss
    res = evaluate(_TokenScorer(), {"table": table}, x, y, ignore_index=-100)
    assert res.n == 2
    assert res.accuracy == pytest.approx(0.5)


def test_empty_input_gives_nan() -> None:
    model, params = _linear()
    res = evaluate(model, params, X[:0], Y[:0], topk=(3,))
    assert res.n == 0
    assert math.isnan(res.loss) and math.isnan(res.accuracy) and math.isnan(res.topk[3])


def test_topk_correct_counts_and_clamps_k() -> None:
    logits = torch.tensor([[0.1, 0.5, 0.4], [0.9, 0.0, 0.1]])
    y = torch.tensor([2, 1])  # row 0: target ranks 2nd; row 1: ranks 3rd
    assert topk_correct(logits, y, (1, 2, 3, 10)) == {1: 0, 2: 1, 3: 2, 10: 2}
    with pytest.raises(ValueError, match="k >= 1"):
        topk_correct(logits, y, (0,))


def test_accuracy_from_logits_sequence_and_shape_check() -> None:
    logits = torch.tensor([[[2.0, 0.0], [0.0, 2.0]]])  # (1, 2, 2): predicts 0 then 1
    assert accuracy_from_logits(logits, torch.tensor([[0, 0]])) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="do not match"):
        accuracy_from_logits(logits, torch.tensor([0, 0]))


def test_weighted_mean() -> None:
    assert weighted_mean([0.5, 1.0], [3, 1]) == pytest.approx((1.5 + 1.0) / 4)
    assert math.isnan(weighted_mean([0.5], [0]))
    with pytest.raises(ValueError, match="weights"):
        weighted_mean([1.0, 2.0], [1.0])
