"""IID: rows dealt uniformly at random into near-equal partitions."""

from __future__ import annotations

import numpy as np

from fedcomm.data.partitioners._common import check_num_partitions, sorted_parts
from fedcomm.data.partitioners.base import Partitioner, register_scheme


class IidPartitioner(Partitioner[list[np.ndarray]]):
    """Split rows uniformly at random into ``num_partitions`` near-equal parts.

    Mirrors ``flwr_datasets.partitioner.IidPartitioner``. Sizes differ by at most one.

    Args:
        labels: ``(n,)`` labels (only the length is used).
        num_partitions: number of partitions, in ``[1, n]``.
        rng: source of randomness.
        shuffle: permute rows first; ``False`` gives contiguous blocks of rows.
    """

    def __init__(
        self,
        labels: np.ndarray,
        *,
        num_partitions: int,
        rng: np.random.Generator,
        shuffle: bool = True,
    ) -> None:
        super().__init__(labels, rng)
        self.num_partitions = check_num_partitions(num_partitions, len(self.labels))
        self.shuffle = shuffle

    def _draw(self) -> list[np.ndarray]:
        n = len(self.labels)
        order = self.rng.permutation(n) if self.shuffle else np.arange(n)
        return sorted_parts(np.array_split(order, self.num_partitions))


iid = register_scheme("iid", IidPartitioner)
