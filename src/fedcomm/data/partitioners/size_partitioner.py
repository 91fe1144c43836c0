"""Quantity skew: partitions of given or log-normally distributed sizes, rows at random."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedcomm.data.partitioners._common import (
    check_int,
    check_num_partitions,
    round_to_total,
    sorted_parts,
)
from fedcomm.data.partitioners.base import Partitioner, PartitionError, register_scheme


class SizePartitioner(Partitioner[list[np.ndarray]]):
    """Quantity skew: partitions of given or log-normally distributed sizes, random rows.

    Mirrors ``flwr_datasets.partitioner.SizePartitioner`` (explicit ``partition_sizes``) and
    FedLab's ``unbalance_sgm`` (``sigma``): sizes proportional to log-normal(0, sigma) draws,
    rounded so that every partition has at least one row and all ``n`` rows are used.
    Give exactly one of ``partition_sizes`` and ``sigma``. With explicit sizes summing to
    less than ``n``, the remaining rows are dropped.

    Args:
        labels: ``(n,)`` labels (only the length is used).
        num_partitions: number of partitions, in ``[1, n]``.
        rng: source of randomness.
        partition_sizes: rows per partition (each >= 1, sum <= n), or None.
        sigma: log-normal spread (>= 0; 0 gives near-equal sizes), or None.

    Raises:
        PartitionError: invalid arguments, e.g. both or neither of ``partition_sizes`` and
            ``sigma``, or sizes summing to more than ``n``.
    """

    def __init__(
        self,
        labels: np.ndarray,
        *,
        num_partitions: int,
        rng: np.random.Generator,
        partition_sizes: Sequence[int] | None = None,
        sigma: float | None = None,
    ) -> None:
        super().__init__(labels, rng)
        n = len(self.labels)
        self.num_partitions = k = check_num_partitions(num_partitions, n)
        if (partition_sizes is None) == (sigma is None):
            raise PartitionError(
                "size needs exactly one of partition_sizes and sigma, got "
                f"partition_sizes={partition_sizes!r}, sigma={sigma!r}"
            )
        # exactly one of: (K,) rows per partition, or the spread their draw uses
        self.sizes = None if partition_sizes is None else _explicit_sizes(partition_sizes, k, n)
        self.sigma = None if sigma is None else _check_sigma(sigma)

    def _draw(self) -> list[np.ndarray]:
        n, k = len(self.labels), self.num_partitions
        if self.sizes is not None:
            sizes = self.sizes
        else:
            assert self.sigma is not None
            weights = self.rng.lognormal(0.0, self.sigma, size=k)  # (K,)
            sizes = 1 + round_to_total(weights / weights.sum() * (n - k), n - k)
        order = self.rng.permutation(n)[: sizes.sum()]
        return sorted_parts(np.split(order, np.cumsum(sizes)[:-1]))


def _explicit_sizes(partition_sizes: Sequence[int], k: int, n: int) -> np.ndarray:
    if len(partition_sizes) != k:
        raise PartitionError(
            f"partition_sizes must have num_partitions={k} entries, got {len(partition_sizes)}"
        )
    sizes = np.array([check_int("partition_sizes[i]", s, low=1) for s in partition_sizes])
    if sizes.sum() > n:
        raise PartitionError(f"partition_sizes sum to {sizes.sum()}, more than the {n} rows")
    return sizes


def _check_sigma(sigma: float) -> float:
    if not (isinstance(sigma, int | float) and math.isfinite(sigma) and sigma >= 0):
        raise PartitionError(f"sigma must be a finite number >= 0, got {sigma!r}")
    return float(sigma)


size = register_scheme("size", SizePartitioner)
