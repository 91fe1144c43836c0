"""Natural ids: one partition per writer (FEMNIST) or role (Shakespeare)."""

from __future__ import annotations

import numpy as np

from fedcomm.data.partitioners._common import check_int, group_by_owner
from fedcomm.data.partitioners.base import Partitioner, PartitionError, register_scheme


class NaturalIdPartitioner(Partitioner[list[np.ndarray]]):
    """One partition per natural id (FEMNIST writer, Shakespeare role), in sorted id order.

    Mirrors ``flwr_datasets.partitioner.NaturalIdPartitioner``. With ``num_partitions`` set,
    only the first ``num_partitions`` ids (sorted) are kept and other rows are dropped. No
    randomness: ``rng`` is kept only so every scheme has the same call shape.

    Args:
        labels: ``(n,)`` labels (only the length is used).
        natural_id: ``(n,)`` integer natural id of each row.
        rng: unused.
        num_partitions: ids to keep, in ``[1, number of ids]``, or None for all.

    Raises:
        PartitionError: invalid arguments.
    """

    def __init__(
        self,
        labels: np.ndarray,
        *,
        natural_id: np.ndarray,
        rng: np.random.Generator,
        num_partitions: int | None = None,
    ) -> None:
        super().__init__(labels, rng)
        n = len(self.labels)
        ids = np.asarray(natural_id)
        if ids.shape != (n,) or not np.issubdtype(ids.dtype, np.integer):
            raise PartitionError(
                f"natural_id must be an integer array of shape ({n},), got {ids.dtype} {ids.shape}"
            )
        _, self.id_rank = np.unique(ids, return_inverse=True)  # (n,) rank of each row's id
        num_ids = int(self.id_rank.max()) + 1
        self.num_partitions = (
            num_ids
            if num_partitions is None
            else check_int("num_partitions", num_partitions, low=1, high=num_ids)
        )

    def _draw(self) -> list[np.ndarray]:
        k = self.num_partitions
        return group_by_owner(np.where(self.id_rank < k, self.id_rank, -1), k)


natural_id = register_scheme("natural_id", NaturalIdPartitioner)
