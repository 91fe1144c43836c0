"""Per-example scores: one pass over distinct examples, any subset's metrics gathered from it,
equal to evaluating that subset directly."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fedcomm.evaluation.metrics import EvalResult, evaluate, score_examples


def _same(a: EvalResult, b: EvalResult) -> None:
    """Equal to the bit (NaN equals NaN)."""
    assert a.n == b.n
    for u, v in [(a.loss, b.loss), (a.accuracy, b.accuracy)] + [
        (a.topk[k], b.topk[k]) for k in a.topk
    ]:
        assert (math.isnan(u) and math.isnan(v)) or u == v
    assert a.topk.keys() == b.topk.keys()


def _linear() -> tuple[nn.Module, dict[str, torch.Tensor], torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Linear(3, 5)
    x = torch.randn(50, 3)  # (50, 3)
    y = torch.randint(0, 5, (50,))
    return model, dict(model.named_parameters()), x, y


@pytest.mark.parametrize("batch_size", [1, 7, 2048])
def test_over_all_rows_is_evaluate(batch_size: int) -> None:
    model, params, x, y = _linear()
    scores = score_examples(model, params, x, y, batch_size=batch_size, topk=(1, 2))
    assert scores.num_examples == 50
    _same(
        scores.over(batch_size=batch_size),
        evaluate(model, params, x, y, batch_size=batch_size, topk=(1, 2)),
    )


@pytest.mark.parametrize("batch_size", [4, 2048])
def test_gathered_rows_with_repeats_equal_evaluating_the_gathered_examples(
    batch_size: int,
) -> None:
    """A row listed twice counts twice, as it did when every subset was materialised."""
    model, params, x, y = _linear()
    scores = score_examples(model, params, x, y, batch_size=16, topk=(2,))
    rows = torch.tensor([3, 3, 10, 0, 49, 10, 10, 7, 3], dtype=torch.int64)
    direct = evaluate(model, params, x[rows], y[rows], batch_size=batch_size, topk=(2,))
    _same(scores.over(rows, batch_size=batch_size), direct)
    assert scores.over(rows).n == 9
    empty = scores.over(torch.zeros(0, dtype=torch.int64))
    assert empty.n == 0 and math.isnan(empty.accuracy) and math.isnan(empty.topk[2])


def test_ensembles_and_ignored_tokens_gather_like_evaluate() -> None:
    """Sequence targets ``(N, T)`` with padding left out, and a two-member ensemble."""
    torch.manual_seed(1)
    model = nn.Linear(4, 6)
    members = [{k: v.detach() + 0.1 * i for k, v in model.named_parameters()} for i in range(2)]
    x = torch.randn(12, 3, 4)  # (N, T, features)
    y = torch.randint(0, 6, (12, 3))
    y[::3, -1] = -100  # padding
    rows = torch.tensor([0, 5, 5, 11, 3], dtype=torch.int64)
    kw = {"topk": (3,), "ignore_index": -100}
    scores = score_examples(model, members, x, y, batch_size=5, **kw)  # type: ignore[arg-type]
    assert scores.loss.shape == (12, 3)
    _same(scores.over(batch_size=5), evaluate(model, members, x, y, batch_size=5, **kw))  # type: ignore[arg-type]
    direct = evaluate(model, members, x[rows], y[rows], batch_size=2, **kw)  # type: ignore[arg-type]
    _same(scores.over(rows, batch_size=2), direct)
    assert direct.n == 15 - int((y[rows] == -100).sum())


def test_scores_validate_their_arguments() -> None:
    model, params, x, y = _linear()
    with pytest.raises(ValueError, match="batch_size"):
        score_examples(model, params, x, y, batch_size=0)
    with pytest.raises(ValueError, match="k >= 1"):
        score_examples(model, params, x, y, topk=(0,))
    with pytest.raises(ValueError, match="batch_size"):
        score_examples(model, params, x, y).over(batch_size=0)
