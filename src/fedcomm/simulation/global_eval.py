"""The global model on the clients' test splits: each distinct test example is run once.

The global model's prediction depends on the example, not on the client holding it, so one pass
over the pool of distinct test examples (:class:`~fedcomm.simulation.data.FederatedTensors`)
gives every client's metrics and the union's, gathered from the per-example results
(:class:`~fedcomm.evaluation.metrics.ExampleScores`). The union weighs each example by the
number of splits holding it, as evaluating the concatenated splits did.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch import Tensor, nn

from fedcomm.evaluation.metrics import EvalResult, evaluate, score_examples
from fedcomm.simulation.data import FederatedTensors, PooledSplits

Params = Mapping[str, Tensor] | Sequence[Mapping[str, Tensor]]


@dataclass(frozen=True)
class GlobalEval:
    """``union``: the model on the union of the test splits; ``clients``: on each client's split
    (empty unless asked for)."""

    union: EvalResult
    clients: tuple[EvalResult, ...] = ()


def evaluate_global(
    model: nn.Module,
    params: Params,
    data: FederatedTensors,
    *,
    batch_size: int = 2048,
    topk: Sequence[int] = (),
    per_client: bool = False,
) -> GlobalEval:
    """Evaluate ``params`` (one model or an ensemble) on ``data``'s test splits.

    Args:
        model: the architecture (see :func:`~fedcomm.evaluation.metrics.evaluate`).
        params: the global parameters, or an ensemble's members.
        data: the federation; its pooled splits cost one forward per distinct example.
        batch_size: examples per forward pass (and rows per partial sum).
        topk: ``k`` values for top-k accuracy.
        per_client: also each client's metrics.

    Returns:
        The union's metrics and, with ``per_client``, each client's.
    """
    pool, splits = data.global_test, data.test
    if not (isinstance(splits, PooledSplits) and splits.pool is pool):  # built by hand
        union = evaluate(model, params, pool.x, pool.y, batch_size=batch_size, topk=topk)
        clients = tuple(
            evaluate(model, params, d.x, d.y, batch_size=batch_size, topk=topk)
            for d in (splits if per_client else ())
        )
        return GlobalEval(union, clients)
    if data.union_rows is None and not per_client:  # the pool is the union: one plain pass
        return GlobalEval(evaluate(model, params, pool.x, pool.y, batch_size=batch_size, topk=topk))
    scores = score_examples(model, params, pool.x, pool.y, batch_size=batch_size, topk=topk)
    rows = splits.rows if per_client else ()
    return GlobalEval(
        scores.over(data.union_rows, batch_size=batch_size),
        tuple(scores.over(r, batch_size=batch_size) for r in rows),
    )
