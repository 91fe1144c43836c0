"""Properties of the partition functions: coverage, sizes, determinism, skew and errors."""

from __future__ import annotations

import math
import time
import warnings
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcomm.data.partitioners import (
    PARTITIONERS,
    ClassAssignmentMode,
    ClientSplits,
    PartitionError,
    dirichlet,
    iid,
    lotteryfl,
    natural_id,
    pathological,
    register,
    shard,
    size,
    train_test_split,
)

FAST = settings(max_examples=40, deadline=None)


@st.composite
def label_arrays(draw: st.DrawFn, min_rows: int = 20, max_rows: int = 300) -> np.ndarray:
    """Labels ``0..C-1`` (every class present) of a random length."""
    num_classes = draw(st.integers(1, 10))
    n = draw(st.integers(max(min_rows, num_classes), max_rows))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    labels = np.concatenate([np.arange(num_classes), rng.integers(0, num_classes, n - num_classes)])
    return rng.permutation(labels).astype(np.int64)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def assert_exact_cover(parts: list[np.ndarray], n: int) -> None:
    """Every row in exactly one partition; each partition sorted int64."""
    for part in parts:
        assert part.dtype == np.int64
        assert np.all(np.diff(part) > 0)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(n))


def assert_disjoint(parts: list[np.ndarray], n: int) -> None:
    rows = np.concatenate(parts)
    assert len(np.unique(rows)) == len(rows)
    assert rows.min(initial=0) >= 0 and rows.max(initial=0) < n


# --- registry -----------------------------------------------------------------------------


def test_registry_holds_every_kind() -> None:
    assert set(PARTITIONERS) == {
        "iid",
        "dirichlet",
        "pathological",
        "shard",
        "size",
        "label_cycle",
        "lotteryfl",
        "natural_id",
    }
    assert PARTITIONERS["dirichlet"] is dirichlet


def test_register_rejects_duplicate_names() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register("iid")(iid)


# --- iid ----------------------------------------------------------------------------------


@FAST
@given(labels=label_arrays(), data=st.data())
def test_iid_covers_rows_with_sizes_within_one(labels: np.ndarray, data: st.DataObject) -> None:
    k = data.draw(st.integers(1, len(labels)))
    parts = iid(labels, num_partitions=k, rng=rng(data.draw(st.integers(0, 99))))
    assert len(parts) == k
    assert_exact_cover(parts, len(labels))
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_iid_without_shuffle_gives_contiguous_blocks() -> None:
    parts = iid(np.zeros(10), num_partitions=3, rng=rng(), shuffle=False)
    assert [p.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


# --- determinism (all kinds) --------------------------------------------------------------

LABELS = np.repeat(np.arange(5), 40)  # (200,) 5 classes x 40 rows
CASES: list[tuple[str, dict[str, Any]]] = [
    ("iid", {"num_partitions": 8}),
    ("dirichlet", {"num_partitions": 8, "alpha": 0.5, "min_partition_size": 2}),
    ("pathological", {"num_partitions": 8, "num_classes_per_partition": 2}),
    ("shard", {"num_partitions": 8, "num_shards_per_partition": 2}),
    ("size", {"num_partitions": 8, "sigma": 1.0}),
    ("natural_id", {"natural_id": np.arange(200) % 7}),
]


@pytest.mark.parametrize(("kind", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_same_seed_same_partition(kind: str, kwargs: dict[str, Any]) -> None:
    first = PARTITIONERS[kind](LABELS, rng=rng(7), **kwargs)
    second = PARTITIONERS[kind](LABELS, rng=rng(7), **kwargs)
    assert isinstance(first, list) and isinstance(second, list)
    assert len(first) == len(second)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_array_equal(a, b)


@FAST
@given(seeds=st.lists(st.integers(0, 2**31), min_size=2, max_size=2, unique=True))
def test_iid_different_seed_different_partition(seeds: list[int]) -> None:
    a, b = (iid(LABELS, num_partitions=4, rng=rng(s)) for s in seeds)
    assert any(not np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_partitioners_leave_global_rng_alone() -> None:
    state = np.random.get_state()[1].copy()  # type: ignore[index]
    for kind, kwargs in [
        *CASES,
        ("lotteryfl", {"num_partitions": 4, "shard_size": 5, "test_per_class": 5}),
    ]:
        PARTITIONERS[kind](LABELS, rng=rng(), **kwargs)
    np.testing.assert_array_equal(np.random.get_state()[1], state)  # type: ignore[index]


@pytest.mark.parametrize("bad", [0, -1, 201, 2.0, None, True])
def test_num_partitions_validated_with_clear_message(bad: Any) -> None:
    with pytest.raises(PartitionError, match=rf"num_partitions.*{bad!r}"):
        iid(LABELS, num_partitions=bad, rng=rng())


# --- dirichlet ----------------------------------------------------------------------------


@FAST
@given(
    labels=label_arrays(min_rows=100),
    k=st.integers(1, 5),
    alpha=st.floats(1.0, 100.0),
    balancing=st.booleans(),
    seed=st.integers(0, 999),
)
def test_dirichlet_covers_rows_and_respects_min_size(
    labels: np.ndarray, k: int, alpha: float, balancing: bool, seed: int
) -> None:
    parts = dirichlet(
        labels,
        num_partitions=k,
        alpha=alpha,
        rng=rng(seed),
        min_partition_size=3,
        self_balancing=balancing,
    )
    assert len(parts) == k
    assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 3


def test_dirichlet_accepts_one_alpha_per_partition() -> None:
    parts = dirichlet(LABELS, num_partitions=3, alpha=[1.0, 2.0, 5.0], rng=rng())
    assert_exact_cover(parts, len(LABELS))


def test_dirichlet_small_alpha_skews_labels() -> None:
    labels = np.repeat(np.arange(10), 100)
    skewed = dirichlet(labels, num_partitions=10, alpha=0.05, rng=rng(), min_partition_size=0)
    even = dirichlet(labels, num_partitions=10, alpha=1000.0, rng=rng(), min_partition_size=0)
    classes = [np.mean([len(np.unique(labels[p])) for p in ps]) for ps in (skewed, even)]
    assert classes[0] < 5 < classes[1]


def test_dirichlet_is_feddsts_per_class_split() -> None:
    """FedDST datasets.py: p = rng.dirichlet(beta * ones(K), size=C); class c's label-sorted rows
    are cut at floor(cumsum(n_c * p_c)). Same draws here with shuffle off and no redraws."""
    labels = np.repeat(np.arange(10), [70, 55, 80, 64, 71, 90, 66, 75, 58, 77])
    k = 40
    parts = dirichlet(
        labels, num_partitions=k, alpha=0.1, rng=rng(3), min_partition_size=0, shuffle=False
    )
    p = rng(3).dirichlet(np.full(k, 0.1), size=10)  # (C, K), one draw per class in class order
    counts = np.bincount(labels)
    cuts = np.cumsum(counts[:, None] * p, axis=1).astype(np.uint64)  # FedDST's offsets
    expected = np.diff(np.concatenate([np.zeros((10, 1)), cuts[:, :-1], counts[:, None]], 1))
    got = np.stack([np.bincount(labels[part], minlength=10) for part in parts], 1)  # (C, K)
    np.testing.assert_array_equal(got, expected)
    assert_exact_cover(parts, len(labels))


@pytest.mark.parametrize(
    ("k", "n", "alpha"),
    [(1000, 200, 0.5), (30, 200, 0.5), (15, 220, 1e-3)],
    ids=["more-partitions-than-rows", "k-times-min-exceeds-n", "alpha-too-small"],
)
def test_dirichlet_impossible_settings_fail_fast(k: int, n: int, alpha: float) -> None:
    labels = np.arange(n) % 10
    start = time.perf_counter()
    with pytest.raises(PartitionError, match="num_partitions"):
        dirichlet(labels, num_partitions=k, alpha=alpha, rng=rng(), min_partition_size=10)
    assert time.perf_counter() - start < 1.0


def test_dirichlet_retry_error_names_the_knobs() -> None:
    with pytest.raises(PartitionError) as err:
        dirichlet(np.arange(220) % 10, num_partitions=15, alpha=1e-3, rng=rng(), max_retries=3)
    msg = str(err.value)
    for needle in ("alpha=0.001", "num_partitions=15", "min_partition_size=10", "4 draws"):
        assert needle in msg
    assert "Increase alpha" in msg


@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan"), [1.0, 1.0], "x"])
def test_dirichlet_rejects_bad_alpha(alpha: Any) -> None:
    with pytest.raises(PartitionError, match="alpha"):
        dirichlet(LABELS, num_partitions=3, alpha=alpha, rng=rng())


# --- pathological -------------------------------------------------------------------------


@FAST
@given(
    num_classes=st.integers(1, 6),
    mode=st.sampled_from(["random", "deterministic", "first-deterministic"]),
    data=st.data(),
)
def test_pathological_limits_classes_per_partition(
    num_classes: int, mode: ClassAssignmentMode, data: st.DataObject
) -> None:
    counts = data.draw(
        st.lists(st.integers(2 * num_classes, 30), min_size=num_classes, max_size=num_classes)
    )
    labels = rng(data.draw(st.integers(0, 99))).permutation(
        np.repeat(np.arange(num_classes), counts)
    )
    m = data.draw(st.integers(1, num_classes))
    k = data.draw(st.integers(num_classes, 2 * num_classes))  # >= C: every class is some first
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "random" may leave a class unheld
        parts = pathological(
            labels,
            num_partitions=k,
            num_classes_per_partition=m,
            rng=rng(data.draw(st.integers(0, 99))),
            class_assignment_mode=mode,
        )
    assert all(len(np.unique(labels[p])) == m for p in parts)
    if mode == "random":
        assert_disjoint(parts, len(labels))
    else:
        assert_exact_cover(parts, len(labels))


def test_pathological_deterministic_mode_assigns_consecutive_classes() -> None:
    parts = pathological(
        LABELS,
        num_partitions=5,
        num_classes_per_partition=2,
        rng=rng(),
        class_assignment_mode="deterministic",
    )
    assert [sorted(np.unique(LABELS[p]).tolist()) for p in parts] == [
        [0, 1],
        [1, 2],
        [2, 3],
        [3, 4],
        [0, 4],
    ]


def test_pathological_first_deterministic_first_class_is_partition_id() -> None:
    parts = pathological(LABELS, num_partitions=5, num_classes_per_partition=3, rng=rng())
    assert all(i in LABELS[p] for i, p in enumerate(parts))


def test_pathological_unheld_class_is_dropped_with_warning() -> None:
    with pytest.warns(UserWarning, match="held by no partition"):
        parts = pathological(
            LABELS,
            num_partitions=2,
            num_classes_per_partition=1,
            rng=rng(),
            class_assignment_mode="deterministic",
        )
    assert set(np.unique(LABELS[np.concatenate(parts)]).tolist()) == {0, 1}
    assert_disjoint(parts, len(LABELS))


def test_pathological_rejects_overused_class_and_bad_mode() -> None:
    labels = np.array([0] * 3 + [1] * 50)
    with pytest.raises(PartitionError, match="class 0 has 3 rows"):
        pathological(
            labels,
            num_partitions=10,
            num_classes_per_partition=2,
            rng=rng(),
            class_assignment_mode="deterministic",
        )
    with pytest.raises(PartitionError, match="num_classes_per_partition"):
        pathological(labels, num_partitions=2, num_classes_per_partition=3, rng=rng())
    with pytest.raises(PartitionError, match="class_assignment_mode"):
        pathological(
            labels,
            num_partitions=2,
            num_classes_per_partition=1,
            rng=rng(),
            class_assignment_mode="bogus",  # type: ignore[arg-type]
        )


# --- shard --------------------------------------------------------------------------------


@FAST
@given(labels=label_arrays(), data=st.data())
def test_shard_sizes_are_shards_times_shard_size(labels: np.ndarray, data: st.DataObject) -> None:
    n = len(labels)
    k = data.draw(st.integers(1, 8))
    s = data.draw(st.integers(1, 4))
    shard_size = data.draw(st.integers(1, max(1, n // (k * s))))
    if k * s * shard_size > n:
        return
    parts = shard(
        labels, num_partitions=k, num_shards_per_partition=s, shard_size=shard_size, rng=rng()
    )
    assert [len(p) for p in parts] == [s * shard_size] * k
    assert_disjoint(parts, n)


@FAST
@given(labels=label_arrays(), data=st.data())
def test_shard_keep_incomplete_covers_every_row(labels: np.ndarray, data: st.DataObject) -> None:
    n = len(labels)
    k = data.draw(st.integers(1, 8))
    seed = data.draw(st.integers(0, 99))
    by_size = shard(
        labels,
        num_partitions=k,
        shard_size=data.draw(st.integers(1, n // k)),
        keep_incomplete_shard=True,
        rng=rng(seed),
    )
    assert_exact_cover(by_size, n)
    by_count = shard(
        labels,
        num_partitions=k,
        num_shards_per_partition=data.draw(st.integers(1, n // k)),
        keep_incomplete_shard=True,
        rng=rng(seed),
    )
    assert_exact_cover(by_count, n)


def test_shard_drops_only_the_incomplete_tail() -> None:
    labels = np.arange(105) % 5
    parts = shard(labels, num_partitions=4, shard_size=10, rng=rng())
    assert sorted(len(p) for p in parts) == [20, 20, 30, 30]  # 10 shards dealt 3,3,2,2
    assert_disjoint(parts, 105)


def test_shard_cuts_label_sorted_blocks() -> None:
    labels = np.repeat(np.arange(10), 20)  # shard_size 20 = one class per shard
    parts = shard(labels, num_partitions=5, num_shards_per_partition=2, rng=rng())
    assert all(len(np.unique(labels[p])) == 2 for p in parts)
    assert_exact_cover(parts, 200)


def test_shard_validates_sizes() -> None:
    with pytest.raises(PartitionError, match="num_shards_per_partition, shard_size"):
        shard(LABELS, num_partitions=2, rng=rng())
    with pytest.raises(PartitionError, match="exceeds"):
        shard(LABELS, num_partitions=10, num_shards_per_partition=3, shard_size=10, rng=rng())
    with pytest.raises(PartitionError, match="shard_size=150"):
        shard(LABELS, num_partitions=2, shard_size=150, rng=rng())
    with pytest.raises(PartitionError, match="shard_size"):
        shard(LABELS, num_partitions=2, shard_size=0, rng=rng())


# --- lotteryfl ----------------------------------------------------------------------------


def assert_lotteryfl(
    labels: np.ndarray, out: ClientSplits, k: int, s: int, size: int, per_class: int
) -> None:
    """Train: s shards of size rows, disjoint. Test: per_class rows of each class the client
    holds, outside every train split, the same rows for every holder of a class."""
    assert len(out.train) == len(out.test) == k
    assert all(len(t) == s * size for t in out.train)
    assert_disjoint(out.train, len(labels))
    train_rows = np.concatenate(out.train)
    shared: dict[int, list[int]] = {}
    for train, test in zip(out.train, out.test, strict=True):
        for part in (train, test):
            assert part.dtype == np.int64 and np.all(np.diff(part) > 0)
        assert len(np.intersect1d(test, train_rows)) == 0
        held = np.unique(labels[train])
        np.testing.assert_array_equal(np.unique(labels[test]), held)
        for c in held.tolist():
            rows = test[labels[test] == c].tolist()
            assert len(rows) == per_class
            assert shared.setdefault(c, rows) == rows


@FAST
@given(data=st.data())
def test_lotteryfl_invariants(data: st.DataObject) -> None:
    num_classes = data.draw(st.integers(1, 6))
    per_class_rows = data.draw(
        st.lists(st.integers(30, 80), min_size=num_classes, max_size=num_classes)
    )
    labels = rng(data.draw(st.integers(0, 99))).permutation(
        np.repeat(np.arange(num_classes), per_class_rows)
    )
    s, size = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6))
    k = data.draw(st.integers(1, 20 // (s * size)))  # <= 20 train rows: >= 10 free per class
    per_class = data.draw(st.integers(1, 10))
    out = lotteryfl(
        labels, num_partitions=k, rng=rng(data.draw(st.integers(0, 99))), shards_per_client=s,
        shard_size=size, test_per_class=per_class,
    )  # fmt: skip
    assert_lotteryfl(labels, out, k, s, size, per_class)


def test_lotteryfl_feddst_setting_two_classes_forty_rows() -> None:
    labels = rng().permutation(np.repeat(np.arange(10), 700))  # class sizes multiples of 20
    out = lotteryfl(labels, num_partitions=100, rng=rng(1))
    assert_lotteryfl(labels, out, 100, 2, 20, 100)
    classes = [len(np.unique(labels[t])) for t in out.train]
    assert set(classes) <= {1, 2} and classes.count(2) > 80  # 2 shards of one class each
    for train in out.train:  # each shard is one class: 20 or 40 rows per class
        assert set(np.bincount(labels[train]).tolist()) <= {0, 20, 40}
    assert sorted({len(t) for t in out.test}) in ([200], [100, 200])
    again = lotteryfl(labels, num_partitions=100, rng=rng(1))
    for a, b in zip(out.train + out.test, again.train + again.test, strict=True):
        np.testing.assert_array_equal(a, b)
    other = lotteryfl(labels, num_partitions=100, rng=rng(2))
    assert any(not np.array_equal(a, b) for a, b in zip(out.train, other.train, strict=True))


def test_lotteryfl_validates_sizes_and_test_rows() -> None:
    labels = np.repeat(np.arange(4), 50)  # 200 rows
    with pytest.raises(PartitionError, match=r"shards_per_client=2 x shard_size=20 = 240"):
        lotteryfl(labels, num_partitions=6, rng=rng())
    with pytest.raises(PartitionError, match=r"class \d+ has \d+ rows outside .*test_per_class=45"):
        lotteryfl(labels, num_partitions=4, rng=rng(), shard_size=10, test_per_class=45)
    for name in ("shards_per_client", "shard_size", "test_per_class"):
        zero: dict[str, Any] = {name: 0}
        with pytest.raises(PartitionError, match=name):
            lotteryfl(labels, num_partitions=2, rng=rng(), **zero)
    with pytest.raises(PartitionError, match="one per client"):
        ClientSplits([np.arange(3)], [])


# --- size ---------------------------------------------------------------------------------


@FAST
@given(labels=label_arrays(), data=st.data())
def test_size_explicit_sizes_are_exact(labels: np.ndarray, data: st.DataObject) -> None:
    n = len(labels)
    k = data.draw(st.integers(1, min(n, 10)))
    cuts = sorted(
        data.draw(st.lists(st.integers(1, n - 1), min_size=k - 1, max_size=k - 1, unique=True))
    )
    sizes = np.diff([0, *cuts, n]).tolist()  # k positive sizes summing to n
    parts = size(labels, num_partitions=k, partition_sizes=sizes, rng=rng())
    assert [len(p) for p in parts] == sizes
    assert_exact_cover(parts, n)


@FAST
@given(labels=label_arrays(), k=st.integers(1, 20), sigma=st.floats(0.0, 3.0))
def test_size_lognormal_uses_every_row(labels: np.ndarray, k: int, sigma: float) -> None:
    parts = size(labels, num_partitions=k, sigma=sigma, rng=rng())
    assert_exact_cover(parts, len(labels))
    assert min(len(p) for p in parts) >= 1


def test_size_sigma_zero_is_balanced_and_partial_sizes_drop_rest() -> None:
    assert [len(p) for p in size(LABELS, num_partitions=4, sigma=0.0, rng=rng())] == [50] * 4
    parts = size(LABELS, num_partitions=2, partition_sizes=[10, 30], rng=rng())
    assert [len(p) for p in parts] == [10, 30]
    assert_disjoint(parts, 200)


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"partition_sizes": [100, 100], "sigma": 1.0},
        {"partition_sizes": [150, 100]},
        {"partition_sizes": [200]},
        {"partition_sizes": [0, 10]},
        {"sigma": -1.0},
    ],
)
def test_size_validates_arguments(kwargs: dict[str, Any]) -> None:
    with pytest.raises(PartitionError, match=r"partition_sizes|sigma"):
        size(LABELS, num_partitions=2, rng=rng(), **kwargs)


# --- natural id ---------------------------------------------------------------------------


@FAST
@given(ids=st.lists(st.integers(-5, 50), min_size=1, max_size=200))
def test_natural_id_one_partition_per_id(ids: list[int]) -> None:
    ids_arr = np.array(ids, dtype=np.int64)
    parts = natural_id(np.zeros(len(ids)), natural_id=ids_arr, rng=rng())
    assert_exact_cover(parts, len(ids))
    assert [int(ids_arr[p[0]]) for p in parts] == sorted(set(ids))
    assert all(len(np.unique(ids_arr[p])) == 1 for p in parts)


def test_natural_id_keeps_first_k_ids() -> None:
    ids = np.array([9, 3, 3, 7, 9, 1])
    parts = natural_id(np.zeros(6), natural_id=ids, rng=rng(), num_partitions=2)
    assert [p.tolist() for p in parts] == [[5], [1, 2]]  # ids 1 and 3
    with pytest.raises(PartitionError, match="num_partitions"):
        natural_id(np.zeros(6), natural_id=ids, rng=rng(), num_partitions=5)
    with pytest.raises(PartitionError, match="natural_id"):
        natural_id(np.zeros(6), natural_id=ids[:3], rng=rng())


# --- train/test split ---------------------------------------------------------------------


@FAST
@given(labels=label_arrays(min_rows=1, max_rows=200), f=st.floats(0.0, 0.99), data=st.data())
def test_train_test_split_is_stratified_disjoint_and_complete(
    labels: np.ndarray, f: float, data: st.DataObject
) -> None:
    n = len(labels)
    indices = np.array(
        sorted(data.draw(st.sets(st.integers(0, n - 1), min_size=0, max_size=n))), dtype=np.int64
    )
    train, test = train_test_split(labels, indices, test_fraction=f, rng=rng())
    assert len(np.intersect1d(train, test)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), indices)
    assert np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
    m = len(indices)
    if m < 2:
        assert len(test) == 0
        return
    assert len(test) == min(math.floor(f * m + 0.5), m - 1)
    for label in np.unique(labels[indices]):
        count = int(np.sum(labels[indices] == label))
        assert abs(int(np.sum(labels[test] == label)) - f * count) <= 1


def test_train_test_split_tiny_clients_and_bad_fraction() -> None:
    labels = np.array([0, 1, 1])
    train, test = train_test_split(labels, np.array([2]), test_fraction=0.5, rng=rng())
    assert train.tolist() == [2] and test.tolist() == []
    train, test = train_test_split(labels, np.array([0, 1]), test_fraction=0.9, rng=rng())
    assert len(train) == 1 and len(test) == 1  # train never empties
    for bad in (1.0, -0.1):
        with pytest.raises(PartitionError, match="test_fraction"):
            train_test_split(labels, np.array([0, 1]), test_fraction=bad, rng=rng())


def test_label_cycle_is_pfedbayes_scheme() -> None:
    from fedcomm.data.partitioners import label_cycle

    labels = np.repeat(np.arange(10), 40)  # 10 classes x 40 rows
    parts = label_cycle(
        labels, num_partitions=4, rng=np.random.default_rng(0), labels_per_partition=5
    )
    # client k holds labels (5k + j) mod 10: 0-4, 5-9, 0-4, 5-9; each class split over 2 holders
    assert [sorted(set(labels[p].tolist())) for p in parts] == [
        [0, 1, 2, 3, 4],
        [5, 6, 7, 8, 9],
        [0, 1, 2, 3, 4],
        [5, 6, 7, 8, 9],
    ]
    assert [len(p) for p in parts] == [100] * 4  # 5 labels x 20 rows each
    allrows = np.concatenate(parts)
    assert len(allrows) == len(set(allrows.tolist())) == 400
    again = label_cycle(
        labels, num_partitions=4, rng=np.random.default_rng(0), labels_per_partition=5
    )
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    with pytest.raises(PartitionError, match="labels_per_partition"):
        label_cycle(labels, num_partitions=4, rng=np.random.default_rng(0), labels_per_partition=11)


def test_label_cycle_client_stride_one_is_a_sliding_window() -> None:
    from fedcomm.data.partitioners import label_cycle

    labels = np.repeat(np.arange(10), 40)
    parts = label_cycle(
        labels,
        num_partitions=10,
        rng=np.random.default_rng(0),
        labels_per_partition=5,
        client_stride=1,
    )
    # client k holds (k + j) mod 10: ten distinct windows; every class held by 5 clients
    assert [sorted(set(labels[p].tolist())) for p in parts] == [
        sorted((k + j) % 10 for j in range(5)) for k in range(10)
    ]
    assert [len(p) for p in parts] == [5 * 8] * 10  # 40 rows of a class / 5 holders
    with pytest.raises(PartitionError, match="client_stride"):
        label_cycle(labels, num_partitions=4, rng=np.random.default_rng(0), client_stride=0)
