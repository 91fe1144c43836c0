"""One client's rows split into train and test, stratified by label."""

from __future__ import annotations

import math

import numpy as np

from fedcomm.data.partitioners._common import round_to_total
from fedcomm.data.partitioners.base import PartitionError


def train_test_split(
    labels: np.ndarray, indices: np.ndarray, *, test_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Split one client's rows into train and test, keeping its label distribution.

    Like flwr-datasets' ``train_test_split`` on a partition, but stratified: label ``l`` with
    ``c`` rows sends ``floor(f*c)`` or ``floor(f*c) + 1`` rows to test, and the total is
    ``round(f * n)`` (half up), capped at ``n - 1`` so train is never empty. A client with
    fewer than 2 rows keeps them all in train.

    Args:
        labels: ``(N,)`` labels of the whole dataset.
        indices: the client's row indices into ``labels`` (distinct).
        test_fraction: share of rows for test, in ``[0, 1)``.
        rng: source of randomness (which rows of a label go to test).

    Returns:
        ``(train, test)`` sorted ``int64`` row indices, disjoint, together ``indices``.
    """
    if not (isinstance(test_fraction, int | float) and 0 <= test_fraction < 1):
        raise PartitionError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    idx = np.sort(np.asarray(indices, dtype=np.int64))
    if len(np.unique(idx)) != len(idx):
        raise PartitionError("indices must be distinct")
    n = len(idx)
    if n < 2:
        return idx, np.empty(0, dtype=np.int64)
    _, inverse, counts = np.unique(np.asarray(labels)[idx], return_inverse=True, return_counts=True)
    total = min(math.floor(test_fraction * n + 0.5), n - 1)
    per_label = round_to_total(test_fraction * counts, total, rng)  # (L,) test rows per label
    order = rng.permutation(n)
    grouped = order[np.argsort(inverse[order], kind="stable")]  # positions grouped by label
    rank = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)  # rank within label
    is_test = np.zeros(n, dtype=bool)
    is_test[grouped[rank < np.repeat(per_label, counts)]] = True
    return idx[~is_test], idx[is_test]
