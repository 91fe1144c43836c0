"""pFedBayes' label cycle: client ``k`` holds labels ``(k·s + j) mod C`` for ``j < n_l``."""

from __future__ import annotations

import numpy as np

from fedcomm.data.partitioners._common import (
    check_int,
    check_num_partitions,
    class_rows,
    group_by_owner,
)
from fedcomm.data.partitioners.base import Partitioner, register_scheme


class LabelCyclePartitioner(Partitioner[list[np.ndarray]]):
    """pFedBayes' label scheme (used by FedBIAD's Table I): client ``k`` holds the labels
    ``(k·s + j) mod C`` for ``j < n_l``; each class's rows are split evenly over its holders.

    With ``s = n_l`` (pFedBayes' code, the default) and ``n_l = C/2`` only two label sets exist
    (half the clients hold classes ``0..4``, half ``5..9`` on MNIST); ``s = 1`` is pFedMe's
    sliding window (``C`` distinct sets).

    Zhang et al., "Personalized Federated Learning via Variational Bayesian Inference" (ICML
    2022) data generation, FedBIAD's MNIST/FMNIST partition (Xue et al., Section V-A). A class
    held by no client (possible when ``num_partitions·n_l < C``) is dropped with its rows.

    Args:
        labels: ``(n,)`` integer labels ``0..C-1``.
        num_partitions: number of clients.
        rng: shuffles each class's rows before they are dealt (``shuffle``).
        labels_per_partition: ``n_l``, labels per client, in ``[1, C]``.
        client_stride: ``s``, the label offset between consecutive clients (``None``: ``n_l``).
        shuffle: deal shuffled rows (else in index order).

    Raises:
        PartitionError: invalid arguments, e.g. ``labels_per_partition`` above the number of
            classes.
    """

    def __init__(
        self,
        labels: np.ndarray,
        *,
        num_partitions: int,
        rng: np.random.Generator,
        labels_per_partition: int = 5,
        client_stride: int | None = None,
        shuffle: bool = True,
    ) -> None:
        super().__init__(labels, rng)
        self.num_partitions = check_num_partitions(num_partitions, len(self.labels))
        self.num_classes = len(np.unique(self.labels))  # classes ranked in sorted label order
        self.labels_per_partition = check_int(
            "labels_per_partition", labels_per_partition, low=1, high=max(self.num_classes, 1)
        )
        self.client_stride = (
            self.labels_per_partition
            if client_stride is None
            else check_int("client_stride", client_stride, low=1)
        )
        self.shuffle = shuffle

    def _draw(self) -> list[np.ndarray]:
        k, num_classes = self.num_partitions, self.num_classes
        holders: list[list[int]] = [[] for _ in range(num_classes)]  # clients of each class
        for client in range(k):
            for j in range(self.labels_per_partition):
                holders[(client * self.client_stride + j) % num_classes].append(client)
        owner = np.full(len(self.labels), -1, dtype=np.int64)
        for c, rows in enumerate(class_rows(self.labels, self.rng, shuffle=self.shuffle)):
            if holders[c]:
                pieces = np.array_split(rows, len(holders[c]))
                for client, part in zip(holders[c], pieces, strict=True):
                    owner[part] = client
        return group_by_owner(owner, k)


label_cycle = register_scheme("label_cycle", LabelCyclePartitioner)
