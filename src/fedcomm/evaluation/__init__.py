"""Evaluation: global / local / top-k metrics of a model, and run summaries for DVC metrics."""

from fedcomm.evaluation.metrics import (
    EvalResult,
    accuracy_from_logits,
    evaluate,
    topk_correct,
    weighted_mean,
)
from fedcomm.evaluation.round_time import LinkModel
from fedcomm.evaluation.seeds import aggregate_seeds
from fedcomm.evaluation.summaries import summarize_run

__all__ = [
    "EvalResult",
    "LinkModel",
    "accuracy_from_logits",
    "aggregate_seeds",
    "evaluate",
    "summarize_run",
    "topk_correct",
    "weighted_mean",
]
