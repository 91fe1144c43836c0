"""McMahan's shards: rows sorted by label, cut into consecutive shards, dealt out at random."""

from __future__ import annotations

import numpy as np

from fedcomm.data.partitioners._common import (
    check_int,
    check_num_partitions,
    group_by_owner,
)
from fedcomm.data.partitioners.base import Partitioner, PartitionError, register_scheme


class ShardPartitioner(Partitioner[list[np.ndarray]]):
    """McMahan's shards: sort rows by label, cut consecutive shards, deal them out at random.

    Mirrors ``flwr_datasets.partitioner.ShardPartitioner`` (McMahan et al., AISTATS 2017,
    arXiv:1602.05629). Give ``num_shards_per_partition`` (s), ``shard_size`` or both:

    - both: every partition gets s shards of ``shard_size`` rows, chosen at random among
      the ``n // shard_size`` complete shards; the rest is dropped (``keep_incomplete_shard``
      has no effect, as in flwr).
    - s only: ``shard_size = n // (num_partitions * s)`` and as above. With
      ``keep_incomplete_shard=True`` the rows are instead cut into ``num_partitions * s``
      near-equal shards so no row is dropped (deviation: flwr then samples among
      ``ceil(n / shard_size)`` shards and can still drop some).
    - ``shard_size`` only: all complete shards are dealt out, ``total // num_partitions``
      each and one more to the first ``total % num_partitions`` partitions; the incomplete
      tail shard is dropped unless ``keep_incomplete_shard=True``.

    Args:
        labels: ``(n,)`` class labels.
        num_partitions: number of partitions, in ``[1, n]``.
        rng: source of randomness.
        num_shards_per_partition: shards per partition (>= 1), or None.
        shard_size: rows per shard (>= 1), or None.
        keep_incomplete_shard: keep the tail rows that do not fill a shard (see above).
        shuffle: break ties within a label at random when sorting (else by row index).

    Raises:
        PartitionError: invalid arguments, or too few rows for the shards asked for.
    """

    def __init__(
        self,
        labels: np.ndarray,
        *,
        num_partitions: int,
        rng: np.random.Generator,
        num_shards_per_partition: int | None = None,
        shard_size: int | None = None,
        keep_incomplete_shard: bool = False,
        shuffle: bool = True,
    ) -> None:
        super().__init__(labels, rng)
        n = len(self.labels)
        self.num_partitions = k = check_num_partitions(num_partitions, n)
        if num_shards_per_partition is None and shard_size is None:
            raise PartitionError(
                "shard needs num_shards_per_partition, shard_size or both; got none"
            )
        s = (
            None
            if num_shards_per_partition is None
            else check_int("num_shards_per_partition", num_shards_per_partition, low=1)
        )
        size = None if shard_size is None else check_int("shard_size", shard_size, low=1)
        # (S,) rows per shard, consecutive in label order; (K,) shards per partition
        self.shard_lengths, self.shard_counts = _shard_layout(n, k, s, size, keep_incomplete_shard)
        self.shuffle = shuffle

    def _draw(self) -> list[np.ndarray]:
        n, k = len(self.labels), self.num_partitions
        lengths, counts = self.shard_lengths, self.shard_counts
        partition_of_shard = np.full(len(lengths), -1, dtype=np.int64)
        chosen = self.rng.permutation(len(lengths))[: counts.sum()]
        partition_of_shard[chosen] = np.repeat(np.arange(k), counts)
        owner_in_label_order = np.full(n, -1, dtype=np.int64)
        owner_in_label_order[: lengths.sum()] = np.repeat(partition_of_shard, lengths)
        perm = self.rng.permutation(n) if self.shuffle else np.arange(n)
        label_order = perm[np.argsort(self.labels[perm], kind="stable")]  # (n,) rows by label
        owner = np.empty(n, dtype=np.int64)
        owner[label_order] = owner_in_label_order
        return group_by_owner(owner, k)


def _shard_layout(
    n: int, k: int, per_partition: int | None, size: int | None, keep_incomplete: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Shard lengths (consecutive from the start of the label order) and shards per partition.

    Returns:
        ``(lengths, counts)``; rows past ``lengths.sum()`` are dropped. ``counts.sum()`` shards
        are dealt out, chosen at random among ``len(lengths)``.
    """
    if per_partition is not None and size is not None:
        if k * per_partition * size > n:
            raise PartitionError(
                f"num_partitions={k} x num_shards_per_partition={per_partition} x "
                f"shard_size={size} = {k * per_partition * size} exceeds the {n} rows"
            )
        return np.full(n // size, size), np.full(k, per_partition)
    if per_partition is not None:
        total = k * per_partition
        if total > n:
            raise PartitionError(
                f"num_partitions={k} x num_shards_per_partition={per_partition} = {total} "
                f"shards exceeds the {n} rows; lower one of them"
            )
        counts = np.full(k, per_partition)
        if keep_incomplete:  # near-equal shards that use every row (deviation from flwr)
            lengths = np.full(total, n // total)
            lengths[: n % total] += 1
            return lengths, counts
        return np.full(n // (n // total), n // total), counts
    assert size is not None
    lengths = np.full(n // size, size, dtype=np.int64)
    if keep_incomplete and n % size:
        lengths = np.append(lengths, n % size)  # the incomplete tail shard
    if len(lengths) < k:
        raise PartitionError(
            f"shard_size={size} gives {len(lengths)} shards for num_partitions={k}; "
            "lower shard_size or num_partitions"
        )
    counts = np.full(k, len(lengths) // k)
    counts[: len(lengths) % k] += 1
    return lengths, counts


shard = register_scheme("shard", ShardPartitioner)
