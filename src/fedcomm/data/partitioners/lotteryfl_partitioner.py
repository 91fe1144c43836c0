"""LotteryFL's split (as FedDST uses it): label-sorted shards for train, shared test rows."""

from __future__ import annotations

from typing import Any

import numpy as np

from fedcomm.data.partitioners._common import check_int, check_num_partitions
from fedcomm.data.partitioners.base import (
    ClientSplits,
    Partitioner,
    PartitionError,
    register_scheme,
)
from fedcomm.data.partitioners.shard_partitioner import ShardPartitioner


class LotteryFLPartitioner(Partitioner[ClientSplits]):
    """LotteryFL's split as FedDST's AAAI-era code uses it: 2 label-sorted shards of 20 rows each.

    Li et al., "LotteryFL" (2020), ``dataset/{mnist,cifar10}_noniid.py`` of
    jeremy313/non-iid-dataset-for-personalized-federated-learning, called by FedDST (Bibikar
    et al., AAAI 2022) ``datasets.py`` ``mode="lotteryfl"`` with 400 clients, 2 classes and 20
    samples. Train: rows sorted by label are cut into consecutive shards of ``shard_size``
    rows (the incomplete tail shard is dropped); every client gets ``shards_per_client``
    distinct shards drawn at random: 40 train rows of 2 classes, or 1 when both shards share a
    label (a shard straddling a class boundary adds a class, as in the original; rare). This
    is :class:`ShardPartitioner` with both sizes given, drawing from the same generator.

    Test: the original gives every client *all* official test images of the classes it holds
    (1000 per class). Our datasets pool the official train and test splits, so here each class
    held by some client gets ``test_per_class`` rows drawn at random from its rows that are in
    no client's train shards, and every client holding the class tests on those same rows.
    Test rows therefore overlap between clients (never with any train row). The global test
    set of the run is the concatenation of the clients' test splits, duplicates included, so
    global accuracy equals the test-size-weighted mean of the per-client accuracies of the
    global model. FedDST reports their unweighted mean; the two differ only through clients
    holding one class (half the test rows).

    Deviations: the original's ``rate_unbalance`` (a shorter second shard) is not offered
    (FedDST leaves it at 1.0, i.e. off); its test slices are ``sorted_test[c·1000:(c+1)·1000]``,
    which for MNIST's uneven class sizes pick some images of neighbouring classes, while here a
    class's test rows are exactly of that class.

    Args:
        labels: ``(n,)`` class labels.
        num_partitions: number of clients, with ``num_partitions * shards_per_client *
            shard_size <= n``.
        rng: source of randomness.
        shards_per_client: shards per client (>= 1).
        shard_size: rows per shard (>= 1).
        test_per_class: test rows per held class (>= 1); every held class needs that many
            rows outside the train shards.
        shuffle: break ties within a label at random when sorting (else by row index).

    Raises:
        PartitionError: invalid arguments or too few rows for the shards; from
            :meth:`partition`, a held class with fewer than ``test_per_class`` rows left
            for testing.
    """

    def __init__(
        self,
        labels: np.ndarray,
        *,
        num_partitions: int,
        rng: np.random.Generator,
        shards_per_client: int = 2,
        shard_size: int = 20,
        test_per_class: int = 100,
        shuffle: bool = True,
    ) -> None:
        super().__init__(labels, rng)
        n = len(self.labels)
        self.num_partitions = k = check_num_partitions(num_partitions, n)
        s = check_int("shards_per_client", shards_per_client, low=1)
        size = check_int("shard_size", shard_size, low=1)
        self.test_per_class = check_int("test_per_class", test_per_class, low=1)
        if k * s * size > n:
            raise PartitionError(
                f"num_partitions={k} x shards_per_client={s} x shard_size={size} = "
                f"{k * s * size} train rows exceeds the {n} rows"
            )
        self.train_shards = ShardPartitioner(
            self.labels,
            num_partitions=k,
            rng=rng,
            num_shards_per_partition=s,
            shard_size=size,
            shuffle=shuffle,
        )

    def _draw(self) -> ClientSplits:
        labels, per_class = self.labels, self.test_per_class
        train = self.train_shards.partition()
        used = np.zeros(len(labels), dtype=bool)  # (n,) row is in some client's train shards
        used[np.concatenate(train)] = True
        test_rows: dict[Any, np.ndarray] = {}
        for c in np.unique(labels[used]).tolist():  # held classes, sorted
            free = np.flatnonzero((labels == c) & ~used)
            if len(free) < per_class:
                raise PartitionError(
                    f"class {c!r} has {len(free)} rows outside the train shards, fewer than "
                    f"test_per_class={per_class}; lower test_per_class or num_partitions"
                )
            test_rows[c] = np.sort(self.rng.choice(free, per_class, replace=False))
        test = [
            np.sort(np.concatenate([test_rows[c] for c in np.unique(labels[rows]).tolist()]))
            for rows in train
        ]
        return ClientSplits(train, [t.astype(np.int64) for t in test])


lotteryfl = register_scheme("lotteryfl", LotteryFLPartitioner)
