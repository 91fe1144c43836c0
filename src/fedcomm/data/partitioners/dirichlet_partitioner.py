"""Dirichlet label skew: each class split over partitions by proportions drawn from Dir(alpha)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedcomm.data.partitioners._common import (
    check_int,
    check_num_partitions,
    class_rows,
    group_by_owner,
)
from fedcomm.data.partitioners.base import Partitioner, PartitionError, register_scheme


class DirichletPartitioner(Partitioner[list[np.ndarray]]):
    """Label skew: each class is split over partitions by proportions drawn from Dir(alpha).

    Mirrors ``flwr_datasets.partitioner.DirichletPartitioner`` (Yurochkin et al., ICML 2019,
    arXiv:1905.12022). Per *class*, proportions over the partitions ~ Dir(alpha); smaller
    alpha gives more skew. Not to be confused with flwr's ``InnerDirichletPartitioner`` (per
    client, Dirichlet over classes), where the same alpha means something else. If any
    partition gets fewer than ``min_partition_size`` rows, all proportions are redrawn, at
    most ``max_retries`` times (flwr hard-codes 10), then :class:`PartitionError` is raised.

    FedDST's ``dirichlet`` mode (Bibikar et al., AAAI 2022, ``datasets.py``; its default with
    ``beta = 0.1`` over 400 clients) is this partitioner with ``alpha=0.1``,
    ``min_partition_size=0`` and ``self_balancing=False``: per class c, ``p_c ~ Dir(0.1·1_K)``
    and the class's rows are cut into contiguous chunks at ``floor(cumsum(p_c)·n_c)`` (FedDST
    cuts them in label-sorted dataset order, we after a permutation when ``shuffle``; same
    distribution). FedDST cuts its official test split with the *same* ``p_c``; here the
    pooled rows are cut once, and :func:`~fedcomm.data.partitioners.train_test_split` then
    sends ``test_fraction`` of each of a client's classes to its test split (within one row
    per class), so each client's test labels follow its train labels, as in FedDST.
    ``test_fraction`` = the official test share (1/7 for MNIST, 1/6 for CIFAR) gives the same
    expected split sizes. One difference: FedDST drops clients whose train or test split is
    empty; here they stay (an empty train split trains no step and has aggregation weight 0,
    an empty test split is left out of local accuracy). Do not use ``min_partition_size`` > 0
    to avoid them at these settings: with alpha 0.1 and 400 clients a few clients are nearly
    empty in almost every draw, so the redraws fail.

    Args:
        labels: ``(n,)`` class labels.
        num_partitions: number of partitions, in ``[1, n]``.
        alpha: concentration, a positive scalar or one positive value per partition.
        rng: source of randomness.
        min_partition_size: smallest acceptable partition (rows); ``num_partitions *
            min_partition_size`` must not exceed ``n``.
        self_balancing: once a partition holds more than ``n / num_partitions`` rows, later
            classes give it nothing (as in the paper's code, and in flwr).
        shuffle: permute each class's rows before cutting them, so the examples a partition
            receives are random rather than the first ones in dataset order.
        max_retries: redraws allowed after the first attempt.

    Raises:
        PartitionError: invalid arguments; from :meth:`partition`, ``min_partition_size``
            still unmet after ``max_retries`` redraws.
    """

    def __init__(
        self,
        labels: np.ndarray,
        *,
        num_partitions: int,
        alpha: float | Sequence[float],
        rng: np.random.Generator,
        min_partition_size: int = 10,
        self_balancing: bool = False,
        shuffle: bool = True,
        max_retries: int = 10,
    ) -> None:
        super().__init__(labels, rng)
        n = len(self.labels)
        self.num_partitions = k = check_num_partitions(num_partitions, n)
        self.alpha = alpha  # as given, for messages
        self.alpha_vector = _alpha_vector(alpha, k)  # (K,)
        self.min_partition_size = min_size = check_int(
            "min_partition_size", min_partition_size, low=0
        )
        self.max_retries = check_int("max_retries", max_retries, low=0)
        if k * min_size > n:
            raise PartitionError(
                f"num_partitions={k} x min_partition_size={min_size} = {k * min_size} rows "
                f"exceeds the {n} rows available; lower num_partitions or min_partition_size"
            )
        self.self_balancing = self_balancing
        self.shuffle = shuffle

    def _draw(self) -> list[np.ndarray]:
        n, k, min_size = len(self.labels), self.num_partitions, self.min_partition_size
        rows_by_class = class_rows(self.labels, self.rng, shuffle=self.shuffle)
        average = n / k if self.self_balancing else None
        smallest = 0
        for _ in range(self.max_retries + 1):
            owner = _dirichlet_owner(rows_by_class, self.alpha_vector, self.rng, average)
            smallest = int(np.bincount(owner, minlength=k).min())
            if smallest >= min_size:
                return group_by_owner(owner, k)
        raise PartitionError(
            f"dirichlet partitioning failed: after {self.max_retries + 1} draws the smallest "
            f"partition had {smallest} rows, below min_partition_size={min_size} "
            f"(alpha={self.alpha!r}, num_partitions={k}, {n} rows, {len(rows_by_class)} "
            f"classes). Increase alpha, lower min_partition_size or num_partitions, or raise "
            f"max_retries."
        )


def _alpha_vector(alpha: float | Sequence[float], num_partitions: int) -> np.ndarray:
    """``alpha`` as a ``(num_partitions,)`` float array of positive finite values."""
    try:
        arr = np.asarray(alpha, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise PartitionError(f"alpha must be a number or a list of numbers, got {alpha!r}") from err
    if arr.ndim == 0:
        arr = np.full(num_partitions, float(arr))
    if arr.shape != (num_partitions,):
        raise PartitionError(
            f"alpha must be a scalar or have one value per partition "
            f"(num_partitions={num_partitions}), got shape {arr.shape}"
        )
    if not (np.isfinite(arr).all() and (arr > 0).all()):
        raise PartitionError(f"alpha must be finite and > 0, got {alpha!r}")
    return arr


def _balanced(proportions: np.ndarray, sizes: np.ndarray, average: float) -> np.ndarray:
    """Zero the share of partitions already above ``average`` rows and renormalise."""
    eligible = sizes <= average  # never empty: not every partition can exceed the mean
    kept = np.where(eligible, proportions, 0.0)
    if kept.sum() == 0:  # every eligible share underflowed to zero
        kept = eligible.astype(np.float64)
    return kept / kept.sum()


def _dirichlet_owner(
    rows_by_class: list[np.ndarray],
    alpha: np.ndarray,
    rng: np.random.Generator,
    average: float | None,
) -> np.ndarray:
    """One Dirichlet draw per class; returns the owning partition of every row, ``(n,)``."""
    num_rows = sum(len(rows) for rows in rows_by_class)
    owner = np.empty(num_rows, dtype=np.int64)
    sizes = np.zeros(len(alpha), dtype=np.int64)  # (K,) rows so far per partition
    for rows in rows_by_class:
        proportions = rng.dirichlet(alpha)
        if average is not None:
            proportions = _balanced(proportions, sizes, average)
        cuts = np.clip((np.cumsum(proportions) * len(rows)).astype(np.int64)[:-1], 0, len(rows))
        counts = np.diff(np.concatenate(([0], cuts, [len(rows)])))  # (K,) rows per partition
        owner[rows] = np.repeat(np.arange(len(alpha)), counts)
        sizes += counts
    return owner


dirichlet = register_scheme("dirichlet", DirichletPartitioner)
