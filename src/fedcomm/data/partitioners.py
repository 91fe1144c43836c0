"""Partition functions: split a dataset's rows over clients by label, quantity or natural id.

Each partitioner is a pure function ``(labels, *, num_partitions, rng, ...) -> list[np.ndarray]``
returning one sorted ``int64`` array of row indices per partition (client). Randomness comes
only from the ``rng`` argument, never from the global NumPy state. Parameter names and
semantics follow ``flwr_datasets.partitioner`` (see each docstring for the class it mirrors
and any deviation). Partitioners are found by name in :data:`PARTITIONERS`.

Unless a docstring says otherwise every row lands in exactly one partition. ``shuffle``
permutes rows *before* they are dealt out (so which examples of a class go where is random);
flwr shuffles the order inside each partition afterwards, which is moot here because indices
are returned sorted.

``train_test_split`` then splits one client's rows into train and test, stratified by label.
A partitioner that picks each client's test rows itself (``lotteryfl``) returns
:class:`ClientSplits` instead, and no per-client split is made.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import numpy as np

from fedcomm.errors import InputError


@dataclass(frozen=True)
class ClientSplits:
    """Each client's train and test rows, for a partitioner that chooses the test rows itself.

    Attributes:
        train: per client, sorted ``int64`` row indices; disjoint between clients.
        test: per client, sorted ``int64`` row indices, disjoint from every client's train
            rows. Test rows of different clients may overlap (``lotteryfl`` gives every holder
            of a class the same test rows of that class).
    """

    train: list[np.ndarray]
    test: list[np.ndarray]

    def __post_init__(self) -> None:
        if len(self.train) != len(self.test):
            raise PartitionError(
                f"{len(self.train)} train but {len(self.test)} test row sets: need one per client"
            )


PartitionFn = Callable[..., list[np.ndarray] | ClientSplits]
"""``fn(labels, *, num_partitions, rng, **params)``: one row array per client, or
:class:`ClientSplits` when the partitioner picks the clients' test rows too."""

ClassAssignmentMode = Literal["random", "deterministic", "first-deterministic"]

PARTITIONERS: dict[str, PartitionFn] = {}
"""Registry: partition kind (``params.yaml`` ``partition.kind``) -> partition function."""

_F = TypeVar("_F", bound=PartitionFn)


class PartitionError(InputError, ValueError):
    """Invalid partition parameters, or a partition that cannot be built from this data."""


def register(name: str) -> Callable[[_F], _F]:
    """Add a partition function to :data:`PARTITIONERS` under ``name``.

    Args:
        name: the partition kind, e.g. ``"dirichlet"``.

    Returns:
        A decorator that registers the function and returns it unchanged.
    """

    def decorator(fn: _F) -> _F:
        if name in PARTITIONERS:
            raise ValueError(f"partitioner {name!r} is already registered")
        PARTITIONERS[name] = fn
        return fn

    return decorator


# --- validation helpers -------------------------------------------------------------------


def _check_int(name: str, value: Any, *, low: int, high: int | None = None) -> int:
    """Return ``value`` as an int if it is an integer in ``[low, high]``, else raise."""
    allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
    is_int = isinstance(value, int | np.integer) and not isinstance(value, bool)
    if not is_int or value < low or (high is not None and value > high):
        raise PartitionError(f"{name} must be an integer {allowed}, got {value!r}")
    return int(value)


def _check_labels(labels: np.ndarray) -> np.ndarray:
    """Return ``labels`` as a non-empty 1-D array, else raise."""
    arr = np.asarray(labels)
    if arr.ndim != 1 or len(arr) == 0:
        raise PartitionError(f"labels must be a non-empty 1-D array, got shape {arr.shape}")
    return arr


def _check_num_partitions(num_partitions: Any, num_rows: int) -> int:
    return _check_int("num_partitions", num_partitions, low=1, high=num_rows)


# --- shared building blocks ---------------------------------------------------------------


def _group(owner: np.ndarray, num_partitions: int) -> list[np.ndarray]:
    """Rows grouped by owning partition (``owner[row]``; ``-1`` = unassigned), sorted."""
    kept = np.flatnonzero(owner >= 0)
    order = kept[np.argsort(owner[kept], kind="stable")]  # stable: rows stay ascending
    counts = np.bincount(owner[kept], minlength=num_partitions)
    return [part.astype(np.int64) for part in np.split(order, np.cumsum(counts)[:-1])]


def _sorted_parts(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.sort(part).astype(np.int64) for part in parts]


def _round_to_total(
    quotas: np.ndarray, total: int, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Integers within 1 of ``quotas`` that sum to ``total`` (largest-remainder rounding).

    Each entry is ``floor(quota)`` or ``floor(quota) + 1``; the ``+1`` goes to the largest
    fractional parts, ties broken by ``rng`` (or by position when ``rng`` is None).
    """
    base = np.floor(quotas).astype(np.int64)
    remaining = max(total - int(base.sum()), 0)
    tiebreak = rng.random(len(quotas)) if rng is not None else np.zeros(len(quotas))
    order = np.lexsort((tiebreak, -(quotas - base)))
    base[order[:remaining]] += 1
    return base


def _class_rows(labels: np.ndarray, rng: np.random.Generator, *, shuffle: bool) -> list[np.ndarray]:
    """Row indices of each class (sorted class order), permuted when ``shuffle``."""
    _, inverse = np.unique(labels, return_inverse=True)
    order = rng.permutation(len(labels)) if shuffle else np.arange(len(labels))
    grouped = order[np.argsort(inverse[order], kind="stable")]
    counts = np.bincount(inverse)
    return np.split(grouped, np.cumsum(counts)[:-1])


# --- iid ----------------------------------------------------------------------------------


@register("iid")
def iid(
    labels: np.ndarray, *, num_partitions: int, rng: np.random.Generator, shuffle: bool = True
) -> list[np.ndarray]:
    """Split rows uniformly at random into ``num_partitions`` near-equal parts.

    Mirrors ``flwr_datasets.partitioner.IidPartitioner``. Sizes differ by at most one.

    Args:
        labels: ``(n,)`` labels (only the length is used).
        num_partitions: number of partitions, in ``[1, n]``.
        rng: source of randomness.
        shuffle: permute rows first; ``False`` gives contiguous blocks of rows.

    Returns:
        One sorted ``int64`` row-index array per partition.
    """
    n = len(_check_labels(labels))
    k = _check_num_partitions(num_partitions, n)
    order = rng.permutation(n) if shuffle else np.arange(n)
    return _sorted_parts(np.array_split(order, k))


# --- dirichlet ----------------------------------------------------------------------------


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
    class_rows: list[np.ndarray],
    alpha: np.ndarray,
    rng: np.random.Generator,
    average: float | None,
) -> np.ndarray:
    """One Dirichlet draw per class; returns the owning partition of every row."""
    num_rows = sum(len(rows) for rows in class_rows)
    owner = np.empty(num_rows, dtype=np.int64)
    sizes = np.zeros(len(alpha), dtype=np.int64)
    for rows in class_rows:
        proportions = rng.dirichlet(alpha)
        if average is not None:
            proportions = _balanced(proportions, sizes, average)
        cuts = np.clip((np.cumsum(proportions) * len(rows)).astype(np.int64)[:-1], 0, len(rows))
        counts = np.diff(np.concatenate(([0], cuts, [len(rows)])))  # (K,) rows per partition
        owner[rows] = np.repeat(np.arange(len(alpha)), counts)
        sizes += counts
    return owner


@register("dirichlet")
def dirichlet(
    labels: np.ndarray,
    *,
    num_partitions: int,
    alpha: float | Sequence[float],
    rng: np.random.Generator,
    min_partition_size: int = 10,
    self_balancing: bool = False,
    shuffle: bool = True,
    max_retries: int = 10,
) -> list[np.ndarray]:
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
    pooled rows are cut once, and :func:`train_test_split` then sends ``test_fraction`` of each
    of a client's classes to its test split (within one row per class), so each client's test
    labels follow its train labels, as in FedDST. ``test_fraction`` = the official test share
    (1/7 for MNIST, 1/6 for CIFAR) gives the same expected split sizes. One difference: FedDST
    drops clients whose train or test split is empty; here they stay (an empty train split
    trains no step and has aggregation weight 0, an empty test split is left out of local
    accuracy). Do not use ``min_partition_size`` > 0 to avoid them at these settings: with
    alpha 0.1 and 400 clients a few clients are nearly empty in almost every draw, so the
    redraws fail.

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

    Returns:
        One sorted ``int64`` row-index array per partition.

    Raises:
        PartitionError: invalid arguments, or ``min_partition_size`` still unmet after
            ``max_retries`` redraws.
    """
    labels = _check_labels(labels)
    n = len(labels)
    k = _check_num_partitions(num_partitions, n)
    alpha_vec = _alpha_vector(alpha, k)
    min_size = _check_int("min_partition_size", min_partition_size, low=0)
    retries = _check_int("max_retries", max_retries, low=0)
    if k * min_size > n:
        raise PartitionError(
            f"num_partitions={k} x min_partition_size={min_size} = {k * min_size} rows exceeds "
            f"the {n} rows available; lower num_partitions or min_partition_size"
        )
    class_rows = _class_rows(labels, rng, shuffle=shuffle)
    average = n / k if self_balancing else None
    smallest = 0
    for _ in range(retries + 1):
        owner = _dirichlet_owner(class_rows, alpha_vec, rng, average)
        smallest = int(np.bincount(owner, minlength=k).min())
        if smallest >= min_size:
            return _group(owner, k)
    raise PartitionError(
        f"dirichlet partitioning failed: after {retries + 1} draws the smallest partition had "
        f"{smallest} rows, below min_partition_size={min_size} (alpha={alpha!r}, "
        f"num_partitions={k}, {n} rows, {len(class_rows)} classes). Increase alpha, lower "
        f"min_partition_size or num_partitions, or raise max_retries."
    )


# --- pathological -------------------------------------------------------------------------


def _assign_classes(
    num_partitions: int,
    per_partition: int,
    num_classes: int,
    mode: str,
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
    if mode == "first-deterministic":
        rows = []
        for pid in range(num_partitions):
            first = pid % num_classes
            others = np.delete(np.arange(num_classes), first)
            rows.append(
                np.concatenate(([first], rng.choice(others, per_partition - 1, replace=False)))
            )
        return np.stack(rows).astype(np.int64)
    raise PartitionError(
        "class_assignment_mode must be 'random', 'deterministic' or 'first-deterministic', "
        f"got {mode!r}"
    )


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
        warnings.warn(
            f"pathological partitioning: classes {unused.tolist()} are held by no partition; "
            "their rows are dropped (use more partitions, or 'first-deterministic' mode with "
            "num_partitions >= number of classes)",
            stacklevel=3,
        )


@register("pathological")
def pathological(
    labels: np.ndarray,
    *,
    num_partitions: int,
    num_classes_per_partition: int,
    rng: np.random.Generator,
    class_assignment_mode: ClassAssignmentMode = "first-deterministic",
    shuffle: bool = True,
) -> list[np.ndarray]:
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

    Returns:
        One sorted ``int64`` row-index array per partition.
    """
    labels = _check_labels(labels)
    k = _check_num_partitions(num_partitions, len(labels))
    classes, counts = np.unique(labels, return_counts=True)
    m = _check_int("num_classes_per_partition", num_classes_per_partition, low=1, high=len(classes))
    assignment = _assign_classes(k, m, len(classes), class_assignment_mode, rng)
    _check_class_usage(np.bincount(assignment.ravel(), minlength=len(classes)), counts, classes)
    owner = np.full(len(labels), -1, dtype=np.int64)
    for c, rows in enumerate(_class_rows(labels, rng, shuffle=shuffle)):
        holders = np.flatnonzero((assignment == c).any(axis=1))
        for holder, piece in zip(holders, np.array_split(rows, max(len(holders), 1)), strict=False):
            owner[piece] = holder
    return _group(owner, k)


# --- shard --------------------------------------------------------------------------------


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


@register("shard")
def shard(
    labels: np.ndarray,
    *,
    num_partitions: int,
    rng: np.random.Generator,
    num_shards_per_partition: int | None = None,
    shard_size: int | None = None,
    keep_incomplete_shard: bool = False,
    shuffle: bool = True,
) -> list[np.ndarray]:
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

    Returns:
        One sorted ``int64`` row-index array per partition; rows not dealt out are dropped.
    """
    labels = _check_labels(labels)
    n = len(labels)
    k = _check_num_partitions(num_partitions, n)
    if num_shards_per_partition is None and shard_size is None:
        raise PartitionError("shard needs num_shards_per_partition, shard_size or both; got none")
    s = (
        None
        if num_shards_per_partition is None
        else _check_int("num_shards_per_partition", num_shards_per_partition, low=1)
    )
    size = None if shard_size is None else _check_int("shard_size", shard_size, low=1)
    lengths, counts = _shard_layout(n, k, s, size, keep_incomplete_shard)
    partition_of_shard = np.full(len(lengths), -1, dtype=np.int64)
    chosen = rng.permutation(len(lengths))[: counts.sum()]
    partition_of_shard[chosen] = np.repeat(np.arange(k), counts)
    owner_in_label_order = np.full(n, -1, dtype=np.int64)
    owner_in_label_order[: lengths.sum()] = np.repeat(partition_of_shard, lengths)
    perm = rng.permutation(n) if shuffle else np.arange(n)
    label_order = perm[np.argsort(labels[perm], kind="stable")]  # (n,) rows sorted by label
    owner = np.empty(n, dtype=np.int64)
    owner[label_order] = owner_in_label_order
    return _group(owner, k)


# --- lotteryfl ----------------------------------------------------------------------------


@register("lotteryfl")
def lotteryfl(
    labels: np.ndarray,
    *,
    num_partitions: int,
    rng: np.random.Generator,
    shards_per_client: int = 2,
    shard_size: int = 20,
    test_per_class: int = 100,
    shuffle: bool = True,
) -> ClientSplits:
    """LotteryFL's split as FedDST's AAAI-era code uses it: 2 label-sorted shards of 20 rows each.

    Li et al., "LotteryFL" (2020), ``dataset/{mnist,cifar10}_noniid.py`` of
    jeremy313/non-iid-dataset-for-personalized-federated-learning, called by FedDST (Bibikar
    et al., AAAI 2022) ``datasets.py`` ``mode="lotteryfl"`` with 400 clients, 2 classes and 20
    samples. Train: rows sorted by label are cut into consecutive shards of ``shard_size``
    rows (the incomplete tail shard is dropped); every client gets ``shards_per_client``
    distinct shards drawn at random: 40 train rows of 2 classes, or 1 when both shards share a
    label (a shard straddling a class boundary adds a class, as in the original; rare). This
    is :func:`shard` with both sizes given.

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

    Returns:
        :class:`ClientSplits`: per client, sorted ``int64`` train rows (disjoint between
        clients) and test rows (``test_per_class`` per class it holds).

    Raises:
        PartitionError: invalid arguments, too few rows for the shards, or a held class with
            fewer than ``test_per_class`` rows left for testing.
    """
    labels = _check_labels(labels)
    n = len(labels)
    k = _check_num_partitions(num_partitions, n)
    s = _check_int("shards_per_client", shards_per_client, low=1)
    size = _check_int("shard_size", shard_size, low=1)
    per_class = _check_int("test_per_class", test_per_class, low=1)
    if k * s * size > n:
        raise PartitionError(
            f"num_partitions={k} x shards_per_client={s} x shard_size={size} = {k * s * size} "
            f"train rows exceeds the {n} rows"
        )
    train = shard(
        labels,
        num_partitions=k,
        rng=rng,
        num_shards_per_partition=s,
        shard_size=size,
        shuffle=shuffle,
    )
    used = np.zeros(n, dtype=bool)
    used[np.concatenate(train)] = True
    test_rows: dict[Any, np.ndarray] = {}
    for c in np.unique(labels[used]).tolist():  # held classes, sorted
        free = np.flatnonzero((labels == c) & ~used)
        if len(free) < per_class:
            raise PartitionError(
                f"class {c!r} has {len(free)} rows outside the train shards, fewer than "
                f"test_per_class={per_class}; lower test_per_class or num_partitions"
            )
        test_rows[c] = np.sort(rng.choice(free, per_class, replace=False))
    test = [
        np.sort(np.concatenate([test_rows[c] for c in np.unique(labels[rows]).tolist()]))
        for rows in train
    ]
    return ClientSplits(train, [t.astype(np.int64) for t in test])


# --- size (quantity skew) -----------------------------------------------------------------


def _explicit_sizes(partition_sizes: Sequence[int], k: int, n: int) -> np.ndarray:
    if len(partition_sizes) != k:
        raise PartitionError(
            f"partition_sizes must have num_partitions={k} entries, got {len(partition_sizes)}"
        )
    sizes = np.array([_check_int("partition_sizes[i]", s, low=1) for s in partition_sizes])
    if sizes.sum() > n:
        raise PartitionError(f"partition_sizes sum to {sizes.sum()}, more than the {n} rows")
    return sizes


def _lognormal_sizes(sigma: float, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if not (isinstance(sigma, int | float) and math.isfinite(sigma) and sigma >= 0):
        raise PartitionError(f"sigma must be a finite number >= 0, got {sigma!r}")
    weights = rng.lognormal(0.0, float(sigma), size=k)
    return 1 + _round_to_total(weights / weights.sum() * (n - k), n - k)


@register("size")
def size(
    labels: np.ndarray,
    *,
    num_partitions: int,
    rng: np.random.Generator,
    partition_sizes: Sequence[int] | None = None,
    sigma: float | None = None,
) -> list[np.ndarray]:
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

    Returns:
        One sorted ``int64`` row-index array per partition.
    """
    n = len(_check_labels(labels))
    k = _check_num_partitions(num_partitions, n)
    if (partition_sizes is None) == (sigma is None):
        raise PartitionError(
            "size needs exactly one of partition_sizes and sigma, got "
            f"partition_sizes={partition_sizes!r}, sigma={sigma!r}"
        )
    if partition_sizes is not None:
        sizes = _explicit_sizes(partition_sizes, k, n)
    else:
        assert sigma is not None
        sizes = _lognormal_sizes(sigma, k, n, rng)
    order = rng.permutation(n)[: sizes.sum()]
    return _sorted_parts(np.split(order, np.cumsum(sizes)[:-1]))


# --- natural id ---------------------------------------------------------------------------


@register("natural_id")
def natural_id(
    labels: np.ndarray,
    *,
    natural_id: np.ndarray,
    rng: np.random.Generator,
    num_partitions: int | None = None,
) -> list[np.ndarray]:
    """One partition per natural id (FEMNIST writer, Shakespeare role), in sorted id order.

    Mirrors ``flwr_datasets.partitioner.NaturalIdPartitioner``. With ``num_partitions`` set,
    only the first ``num_partitions`` ids (sorted) are kept and other rows are dropped.

    Args:
        labels: ``(n,)`` labels (only the length is used).
        natural_id: ``(n,)`` integer natural id of each row.
        rng: unused; accepted so every partitioner has the same call shape.
        num_partitions: ids to keep, in ``[1, number of ids]``, or None for all.

    Returns:
        One sorted ``int64`` row-index array per kept id.
    """
    del rng
    n = len(_check_labels(labels))
    ids = np.asarray(natural_id)
    if ids.shape != (n,) or not np.issubdtype(ids.dtype, np.integer):
        raise PartitionError(
            f"natural_id must be an integer array of shape ({n},), got {ids.dtype} {ids.shape}"
        )
    _, inverse = np.unique(ids, return_inverse=True)
    num_ids = int(inverse.max()) + 1
    k = (
        num_ids
        if num_partitions is None
        else _check_int("num_partitions", num_partitions, low=1, high=num_ids)
    )
    return _group(np.where(inverse < k, inverse, -1), k)


@register("label_cycle")
def label_cycle(
    labels: np.ndarray,
    *,
    num_partitions: int,
    rng: np.random.Generator,
    labels_per_partition: int = 5,
    client_stride: int | None = None,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """pFedBayes' label scheme (used by FedBIAD's Table I): client ``k`` holds the labels
    ``(k·s + j) mod C`` for ``j < n_l``; each class's rows are split evenly over its holders.

    With ``s = n_l`` (pFedBayes' code, the default) and ``n_l = C/2`` only two label sets exist
    (half the clients hold classes ``0..4``, half ``5..9`` on MNIST); ``s = 1`` is pFedMe's
    sliding window (``C`` distinct sets).

    Zhang et al., "Personalized Federated Learning via Variational Bayesian Inference" (ICML
    2022) data generation, as described in ``specs/fedsparse-fedbiad.md`` §2.4. A class held by
    no client (possible when ``num_partitions·n_l < C``) is dropped with its rows.

    Args:
        labels: ``(n,)`` integer labels ``0..C-1``.
        num_partitions: number of clients.
        rng: shuffles each class's rows before they are dealt (``shuffle``).
        labels_per_partition: ``n_l``, labels per client, in ``[1, C]``.
        client_stride: ``s``, the label offset between consecutive clients (``None``: ``n_l``).
        shuffle: deal shuffled rows (else in index order).

    Returns:
        One sorted ``int64`` row-index array per client.
    """
    y = _check_labels(labels)
    n = len(y)
    k = _check_num_partitions(num_partitions, n)
    num_classes = len(np.unique(y))  # classes ranked in sorted label order
    n_l = _check_int("labels_per_partition", labels_per_partition, low=1, high=max(num_classes, 1))
    stride = n_l if client_stride is None else _check_int("client_stride", client_stride, low=1)
    holders: list[list[int]] = [[] for _ in range(num_classes)]
    for client in range(k):
        for j in range(n_l):
            holders[(client * stride + j) % num_classes].append(client)
    owner = np.full(n, -1, dtype=np.int64)
    for c, rows in enumerate(_class_rows(y, rng, shuffle=shuffle)):
        if holders[c]:
            for client, part in zip(holders[c], np.array_split(rows, len(holders[c])), strict=True):
                owner[part] = client
    return _group(owner, k)


# --- per-client train/test split ----------------------------------------------------------


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
    per_label = _round_to_total(test_fraction * counts, total, rng)  # (L,) test rows per label
    order = rng.permutation(n)
    grouped = order[np.argsort(inverse[order], kind="stable")]  # positions grouped by label
    rank = np.arange(n) - np.repeat(np.cumsum(counts) - counts, counts)  # rank within label
    is_test = np.zeros(n, dtype=bool)
    is_test[grouped[rank < np.repeat(per_label, counts)]] = True
    return idx[~is_test], idx[is_test]
