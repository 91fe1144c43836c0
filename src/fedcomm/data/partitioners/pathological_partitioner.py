"""Pathological label skew: every partition holds exactly ``num_classes_per_partition`` classes."""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np

from fedcomm.data.partitioners._common import (
    check_int,
    check_num_partitions,
    class_rows,
    group_by_owner,
    warn_caller,
)
from fedcomm.data.partitioners.base import Partitioner, PartitionError, register_scheme

ClassAssignmentMode = Literal["random", "deterministic", "first-deterministic"]


class PathologicalPartitioner(Partitioner[list[np.ndarray]]):
    """Each partition holds exactly ``num_classes_per_partition`` classes.

    Mirrors ``flwr_datasets.partitioner.PathologicalPartitioner`` (Li et al., "Federated
    Learning on Non-IID Data Silos", ICDE 2022, arXiv:2102.02079). Classes are first assigned
    to partitions, then each class's rows are split evenly among the partitions holding it.
    Deviations: the default mode is the paper's ``"first-deterministic"`` (flwr defaults to
    ``"random"``), and class ``i`` means the ``i``-th smallest label. Rows of a class held by
    no partition are dropped, with a warning.

    Args:
        labels: ``(n,)`` class labels.
        num_partitions: number of partitions, in ``[1, n]``.
        num_classes_per_partition: classes per partition, in ``[1, number of classes]``.
        rng: source of randomness.
        class_assignment_mode: ``"random"`` (distinct classes at random),
            ``"deterministic"`` (partition ``i`` gets classes ``i, i+1, ...`` mod ``C``) or
            ``"first-deterministic"`` (first class ``i % C``, the rest at random).
        shuffle: permute each class's rows before splitting them.

    Raises:
        PartitionError: invalid arguments; from :meth:`partition`, a class assigned to more
            partitions than it has rows.
    """

    def __init__(
        self,
        labels: np.ndarray,
        *,
        num_partitions: int,
        num_classes_per_partition: int,
        rng: np.random.Generator,
        class_assignment_mode: ClassAssignmentMode = "first-deterministic",
        shuffle: bool = True,
    ) -> None:
        super().__init__(labels, rng)
        self.num_partitions = check_num_partitions(num_partitions, len(self.labels))
        self.classes, self.counts = np.unique(self.labels, return_counts=True)  # (C,), (C,)
        self.num_classes_per_partition = check_int(
            "num_classes_per_partition", num_classes_per_partition, low=1, high=len(self.classes)
        )
        if class_assignment_mode not in get_args(ClassAssignmentMode):
            raise PartitionError(
                "class_assignment_mode must be 'random', 'deterministic' or "
                f"'first-deterministic', got {class_assignment_mode!r}"
            )
        self.class_assignment_mode = class_assignment_mode
        self.shuffle = shuffle

    def _draw(self) -> list[np.ndarray]:
        k, num_classes = self.num_partitions, len(self.classes)
        assignment = _assign_classes(
            k, self.num_classes_per_partition, num_classes, self.class_assignment_mode, self.rng
        )
        uses = np.bincount(assignment.ravel(), minlength=num_classes)  # (C,) holders per class
        _check_class_usage(uses, self.counts, self.classes)
        owner = np.full(len(self.labels), -1, dtype=np.int64)
        for c, rows in enumerate(class_rows(self.labels, self.rng, shuffle=self.shuffle)):
            holders = np.flatnonzero((assignment == c).any(axis=1))
            pieces = np.array_split(rows, max(len(holders), 1))
            for holder, piece in zip(holders, pieces, strict=False):
                owner[piece] = holder
        return group_by_owner(owner, k)


def _assign_classes(
    num_partitions: int,
    per_partition: int,
    num_classes: int,
    mode: ClassAssignmentMode,
    rng: np.random.Generator,
) -> np.ndarray:
    """``(num_partitions, per_partition)`` class positions (into the sorted unique labels)."""
    ids = np.arange(num_partitions)[:, None]
    if mode == "deterministic":
        return (ids + np.arange(per_partition)) % num_classes
    if mode == "random":
        return np.stack(
            [rng.choice(num_classes, per_partition, replace=False) for _ in range(num_partitions)]
        )
    rows = []  # "first-deterministic"
    for pid in range(num_partitions):
        first = pid % num_classes
        others = np.delete(np.arange(num_classes), first)
        rows.append(np.concatenate(([first], rng.choice(others, per_partition - 1, replace=False))))
    return np.stack(rows).astype(np.int64)


def _check_class_usage(uses: np.ndarray, counts: np.ndarray, classes: np.ndarray) -> None:
    """Raise if a class is assigned to more partitions than it has rows; warn if unused."""
    over = np.flatnonzero(uses > counts)
    if len(over):
        c = over[0]
        raise PartitionError(
            f"class {classes[c].item()!r} has {counts[c]} rows but is assigned to {uses[c]} "
            "partitions; lower num_partitions or num_classes_per_partition, or use "
            "class_assignment_mode='deterministic'"
        )
    unused = classes[uses == 0]
    if len(unused):
        warn_caller(
            f"pathological partitioning: classes {unused.tolist()} are held by no partition; "
            "their rows are dropped (use more partitions, or 'first-deterministic' mode with "
            "num_partitions >= number of classes)"
        )


pathological = register_scheme("pathological", PathologicalPartitioner)
