"""The global model is run once per distinct test example; every client's metrics and the
union's are gathered from that pass and equal evaluating the materialised splits, as the loop
and the evaluate stage did before the pool."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from fedcomm.data.federated import PartitionSpec, RowPool, make_partition
from fedcomm.data.types import Dataset
from fedcomm.evaluation.metrics import EvalResult, evaluate
from fedcomm.simulation.data import FederatedTensors, PooledSplits
from fedcomm.simulation.global_eval import evaluate_global


def _toy(n_per_class: int = 60) -> Dataset:
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), n_per_class)
    x = (labels[:, None] + rng.normal(0, 1.5, (len(labels), 2))).astype(np.float32)  # (n, 2)
    return Dataset(name="toy", x=x, y=labels, num_classes=4)


SHARED = PartitionSpec("lotteryfl", 6, {"shard_size": 10, "test_per_class": 8}, 0.0, 1)
DISJOINT = PartitionSpec("dirichlet", 6, {"alpha": 1.0, "min_partition_size": 5}, 0.3, 1)


def _same(a: EvalResult, b: EvalResult, *, exact: bool = True) -> None:
    """Equal counts and accuracies; the loss to the bit, or (``exact=False``: the model's CPU
    kernels may round an example's logits differently in batches of other sizes, by an ulp)
    within 1e-6 relative."""
    assert a.n == b.n
    same_loss = a.loss == b.loss if exact else a.loss == pytest.approx(b.loss, rel=1e-6)
    assert (math.isnan(a.loss) and math.isnan(b.loss)) or same_loss
    assert (math.isnan(a.accuracy) and math.isnan(b.accuracy)) or a.accuracy == b.accuracy
    assert a.topk == b.topk or all(math.isnan(v) for v in (*a.topk.values(), *b.topk.values()))


def _materialised(data: Dataset, test: tuple[np.ndarray, ...]) -> tuple[Any, list[Any]]:
    """The splits as the loop held them before: one copy per client, and their concatenation."""
    x, y = torch.from_numpy(data.x), torch.from_numpy(data.y).long()
    per = [(x[torch.from_numpy(np.array(t))], y[torch.from_numpy(np.array(t))]) for t in test]
    union = torch.from_numpy(np.concatenate(test))
    return (x[union], y[union]), per


@pytest.mark.parametrize("spec", [SHARED, DISJOINT], ids=["shared", "disjoint"])
@pytest.mark.parametrize("batch_size", [5, 2048])
def test_pooled_metrics_equal_the_materialised_splits(spec: PartitionSpec, batch_size: int) -> None:
    data = _toy()
    part = make_partition(data, spec)
    fed = FederatedTensors.build(data, part.train, part.test)
    torch.manual_seed(0)
    model = nn.Linear(2, 4)
    params = dict(model.named_parameters())
    (ux, uy), per = _materialised(data, part.test)
    got = evaluate_global(model, params, fed, batch_size=batch_size, topk=(2,), per_client=True)
    exact = batch_size > 100  # each set in one batch: the same logits, so the same bits
    want = evaluate(model, params, ux, uy, batch_size=batch_size, topk=(2,))
    _same(got.union, want, exact=exact or spec is DISJOINT)  # disjoint: the very same batches
    assert len(got.clients) == len(per) == 6
    for r, (cx, cy) in zip(got.clients, per, strict=True):
        _same(r, evaluate(model, params, cx, cy, batch_size=batch_size, topk=(2,)), exact=exact)
    for c, (cx, cy) in enumerate(per):  # a client's split, gathered on request
        assert torch.equal(fed.test[c].x, cx) and torch.equal(fed.test[c].y, cy)
    assert got.union.n == sum(len(t) for t in part.test) == fed.union_size


def test_shared_rows_are_stored_and_run_once() -> None:
    data = _toy()
    part = make_partition(data, SHARED)
    union = np.concatenate(part.test)
    assert len(np.unique(union)) < len(union)  # the setup shares test rows
    fed = FederatedTensors.build(data, part.train, part.test)
    assert fed.global_test.num_examples == len(np.unique(union)) == 4 * 8
    seen: list[int] = []
    model = nn.Linear(2, 4)
    model.register_forward_hook(lambda m, inp, out: seen.append(len(inp[0])))
    params = dict(model.named_parameters())
    got = evaluate_global(model, params, fed, batch_size=7, per_client=True)
    assert sum(seen) == 32  # one forward per distinct example, not per (client, example)
    assert got.union.n == len(union)


def test_row_pool_indexes_each_split() -> None:
    test = (np.array([1, 4, 9]), np.array([4, 9]), np.array([], dtype=np.int64), np.array([2]))
    pool = RowPool.of(test)
    assert pool.rows.tolist() == [1, 2, 4, 9]
    for rows, where in zip(test, pool.clients, strict=True):
        assert pool.rows[where].tolist() == rows.tolist()
    assert pool.union is not None and pool.rows[pool.union].tolist() == [1, 4, 9, 4, 9, 2]
    disjoint = RowPool.of((np.array([5, 6]), np.array([0])))
    assert disjoint.union is None and disjoint.rows.tolist() == [5, 6, 0]  # the union, in order
    assert [w.tolist() for w in disjoint.clients] == [[0, 1], [2]]
    assert RowPool.of(()).clients == ()


def test_union_rows_must_index_the_pool_of_the_splits() -> None:
    data = _toy()
    part = make_partition(data, SHARED)
    fed = FederatedTensors.build(data, part.train, part.test)
    assert isinstance(fed.test, PooledSplits) and fed.union_rows is not None
    other = fed.test[0]
    with pytest.raises(ValueError, match="union_rows"):
        FederatedTensors(fed.train, fed.test, other, 4, (2,), fed.union_rows)
    moved = fed.to(torch.device("meta"))
    assert isinstance(moved.test, PooledSplits) and moved.test.pool is moved.global_test
    assert moved.union_rows is not None and moved.union_rows.device.type == "meta"
