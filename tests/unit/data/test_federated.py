"""Building, hashing, storing and reloading partitions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedcomm.data.federated import Partition, PartitionSpec, make_partition, partition_hash
from fedcomm.data.partition_files import (
    StalePartitionError,
    partition_is_current,
    read_partition,
    write_partition,
)
from fedcomm.data.partitioners import PartitionError
from fedcomm.data.types import Dataset


def toy(n: int = 240, num_classes: int = 4, seed: int = 0, **kwargs: Any) -> Dataset:
    labels = np.random.default_rng(seed).integers(0, num_classes, n).astype(np.int64)
    return Dataset(
        name="toy", x=np.zeros((n, 1), np.float32), y=labels, num_classes=num_classes, **kwargs
    )


SPEC = PartitionSpec(
    kind="dirichlet",
    num_partitions=6,
    params={"alpha": 0.5, "min_partition_size": 5},
    test_fraction=0.25,
    seed=3,
)


def assert_same(a: Partition, b: Partition) -> None:
    assert a.hash == b.hash and a.num_classes == b.num_classes
    np.testing.assert_array_equal(a.client_ids, b.client_ids)
    for x, y in zip(a.train + a.test, b.train + b.test, strict=True):
        np.testing.assert_array_equal(x, y)


# --- make_partition -----------------------------------------------------------------------


@settings(max_examples=20, deadline=None)
@given(
    kind_params=st.sampled_from(
        [
            ("iid", {}),
            ("dirichlet", {"alpha": 1.0, "min_partition_size": 2}),
            ("pathological", {"num_classes_per_partition": 2}),
            ("shard", {"num_shards_per_partition": 2, "keep_incomplete_shard": True}),
            ("size", {"sigma": 0.5}),
        ]
    ),
    k=st.integers(4, 10),
    f=st.floats(0.0, 0.5),
    seed=st.integers(0, 2**31),
)
def test_make_partition_splits_every_row_once(
    kind_params: tuple[str, dict[str, Any]], k: int, f: float, seed: int
) -> None:
    kind, params = kind_params
    data = toy()
    part = make_partition(data, PartitionSpec(kind, k, params, f, seed))
    assert part.client_ids.tolist() == list(range(k))
    rows = np.concatenate(part.train + part.test)
    np.testing.assert_array_equal(np.sort(rows), np.arange(len(data)))
    assert all(not arr.flags.writeable for arr in part.train + part.test)


def test_make_partition_is_deterministic_and_seed_sensitive() -> None:
    data = toy()
    assert_same(make_partition(data, SPEC), make_partition(data, SPEC))
    other = make_partition(data, dataclasses.replace(SPEC, seed=4))
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(make_partition(data, SPEC).train, other.train, strict=True)
    )


def test_make_partition_natural_id_uses_dataset_ids() -> None:
    ids = np.arange(240) % 5
    part = make_partition(
        toy(natural_id=ids), PartitionSpec("natural_id", None, {}, test_fraction=0.2, seed=0)
    )
    assert part.num_clients == 5
    for client, (train, test) in enumerate(zip(part.train, part.test, strict=True)):
        assert set(ids[np.concatenate([train, test])].tolist()) == {client}
    with pytest.raises(PartitionError, match="natural ids"):
        make_partition(toy(), PartitionSpec("natural_id", None, {}, 0.2, 0))


@pytest.mark.parametrize(
    ("kind", "params", "match"),
    [
        ("nope", {}, "unknown partition kind 'nope'"),
        ("dirichlet", {"alpha": 1.0, "beta": 2}, r"\['beta'\]"),
        ("iid", {"rng": 1}, r"\['rng'\]"),
        ("dirichlet", {}, r"missing required params \['alpha'\]"),
    ],
)
def test_make_partition_rejects_bad_specs(kind: str, params: dict[str, Any], match: str) -> None:
    with pytest.raises(PartitionError, match=match):
        make_partition(toy(), PartitionSpec(kind, 4, params, 0.2, 0))


def test_dirichlet_test_splits_follow_each_clients_train_labels() -> None:
    """FedDST's Dirichlet setting (beta 0.1, many small clients): its test split is cut with the
    same p_c as its train split; here each client's rows are split per label, so its test label
    counts are test_fraction of its rows of that label, within one row."""
    labels = np.repeat(np.arange(10), 700)  # MNIST-like pool: 6000 + 1000 rows per class
    data = Dataset(name="toy", x=np.zeros((7000, 1), np.float32), y=labels, num_classes=10)
    f = 1 / 7  # the official test share
    spec = PartitionSpec("dirichlet", 100, {"alpha": 0.1, "min_partition_size": 0}, f, 0)
    part = make_partition(data, spec)
    skew = []
    for train, test in zip(part.train, part.test, strict=True):
        tr, te = (np.bincount(labels[rows], minlength=10) for rows in (train, test))
        assert np.all(np.abs(te - f * (tr + te)) <= 1)
        assert set(np.flatnonzero(te)) <= set(np.flatnonzero(tr))  # no test-only labels
        skew.append(np.count_nonzero(tr + te))
    assert np.mean(skew) < 5  # alpha 0.1: a few classes per client


def test_lotteryfl_partition_keeps_explicit_test_rows(tmp_path: Path) -> None:
    labels = np.repeat(np.arange(4), 60)
    data = Dataset(name="toy", x=np.zeros((240, 1), np.float32), y=labels, num_classes=4)
    spec = PartitionSpec("lotteryfl", 5, {"shard_size": 10, "test_per_class": 8}, 0.0, 1)
    part = make_partition(data, spec)
    assert [len(t) for t in part.train] == [20] * 5
    for train, test in zip(part.train, part.test, strict=True):
        assert set(labels[test].tolist()) == set(labels[train].tolist())
        assert len(test) == 8 * len(set(labels[train].tolist()))
    shared = np.concatenate(part.test)
    assert len(np.unique(shared)) < len(shared)  # holders of a class share its test rows
    counts = part.label_counts(labels)
    assert counts["count"].sum() == 100 + len(shared)  # a shared row counts once per client
    out = tmp_path / "p"
    write_partition(part, data, out, spec)
    assert_same(read_partition(out, expected_hash=part.hash), part)
    with pytest.raises(PartitionError, match="test_fraction must be 0"):
        make_partition(data, dataclasses.replace(spec, test_fraction=0.2))


def test_overlapping_test_splits_global_accuracy_is_test_size_weighted_mean() -> None:
    import torch

    from fedcomm.evaluation.metrics import evaluate
    from fedcomm.simulation.data import FederatedTensors
    from fedcomm.simulation.global_eval import evaluate_global

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 60)
    x = (labels[:, None] + rng.normal(0, 1.5, (240, 2))).astype(np.float32)  # (240, 2)
    data = Dataset(name="toy", x=x, y=labels, num_classes=4)
    spec = PartitionSpec("lotteryfl", 5, {"shard_size": 10, "test_per_class": 8}, 0.0, 1)
    part = make_partition(data, spec)
    fed = FederatedTensors.build(data, part.train, part.test)
    model = torch.nn.Linear(2, 4)
    params = dict(model.named_parameters())
    per_client = [evaluate(model, params, d.x, d.y) for d in fed.test]
    g = evaluate_global(model, params, fed).union  # the union, from the pool's predictions
    assert fed.global_test.num_examples == 4 * 8  # the pool: each class's 8 test rows once
    assert g.n == sum(r.n for r in per_client) == sum(len(t) for t in part.test)
    weighted = sum(r.accuracy * r.n for r in per_client) / g.n
    assert g.accuracy == pytest.approx(weighted)


@pytest.mark.parametrize(("field", "value"), [("test_fraction", 1.0), ("seed", -1)])
def test_spec_validates_fraction_and_seed(field: str, value: Any) -> None:
    with pytest.raises(PartitionError, match=field):
        dataclasses.replace(SPEC, **{field: value})


def test_label_counts_match_numpy() -> None:
    data = toy()
    part = make_partition(data, SPEC)
    counts = part.label_counts(data.labels)
    assert counts.columns == ["client_id", "split", "label", "count"]
    assert counts["count"].sum() == len(data)
    row = counts.row(0, named=True)
    rows = part.train[row["client_id"]] if row["split"] == "train" else part.test[row["client_id"]]
    assert row["count"] == int(np.sum(data.labels[rows] == row["label"]))


# --- hashing ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "iid", "params": {}},
        {"num_partitions": 7},
        {"params": {"alpha": 0.6, "min_partition_size": 5}},
        {"test_fraction": 0.2},
        {"seed": 4},
    ],
)
def test_hash_changes_with_every_spec_field(change: dict[str, Any]) -> None:
    fp = toy().fingerprint()
    assert partition_hash(fp, SPEC) != partition_hash(fp, dataclasses.replace(SPEC, **change))


def test_hash_changes_with_data_and_ignores_param_order() -> None:
    assert partition_hash(toy().fingerprint(), SPEC) != partition_hash(
        toy(seed=1).fingerprint(), SPEC
    )
    reordered = dataclasses.replace(SPEC, params={"min_partition_size": 5, "alpha": 0.5})
    fp = toy().fingerprint()
    assert partition_hash(fp, SPEC) == partition_hash(fp, reordered)
    assert len(partition_hash(fp, SPEC)) == 64


def test_spec_params_are_read_only_and_numpy_values_hash() -> None:
    spec = PartitionSpec("dirichlet", 4, {"alpha": np.float64(0.5)}, 0.2, 0)
    with pytest.raises(TypeError):
        spec.params["alpha"] = 1.0  # type: ignore[index]
    fp = toy().fingerprint()
    assert partition_hash(fp, spec) == partition_hash(
        fp, dataclasses.replace(spec, params={"alpha": 0.5})
    )


# --- storage ------------------------------------------------------------------------------


@pytest.fixture
def written(tmp_path: Path) -> tuple[Dataset, Partition, Path]:
    data = toy()
    part = make_partition(data, SPEC)
    out = tmp_path / "partitions" / "toy"
    write_partition(part, data, out, SPEC)
    return data, part, out


def test_write_read_round_trip(written: tuple[Dataset, Partition, Path]) -> None:
    data, part, out = written
    assert sorted(p.name for p in out.iterdir()) == [
        "assignments.parquet",
        "label_counts.parquet",
        "manifest.json",
    ]
    assert_same(read_partition(out, expected_hash=part.hash), part)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["hash"] == part.hash and manifest["dataset"] == "toy"
    assert manifest["spec"]["params"] == {"alpha": 0.5, "min_partition_size": 5}
    assert (manifest["num_clients"], manifest["num_rows"]) == (6, len(data))
    assert {"dataset_fingerprint", "fedcomm_version"} <= set(manifest)
    table = pl.read_parquet(out / "assignments.parquet")
    assert table.schema["client_id"] == pl.Int32 and table.schema["row"] == pl.Int64
    assert set(table["split"].cast(pl.String).unique()) == {"train", "test"}
    assert pl.read_parquet(out / "label_counts.parquet").equals(part.label_counts(data.labels))


def test_read_rejects_stale_hash(written: tuple[Dataset, Partition, Path]) -> None:
    _, part, out = written
    with pytest.raises(StalePartitionError, match="dvc repro partition") as err:
        read_partition(out, expected_hash="0" * 64)
    assert isinstance(err.value, ValueError)
    assert partition_is_current(out, part.hash)
    assert not partition_is_current(out, "0" * 64)


def test_read_reports_missing_files(
    tmp_path: Path, written: tuple[Dataset, Partition, Path]
) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing assignments\.parquet"):
        read_partition(tmp_path / "nowhere")
    _, part, out = written
    (out / "label_counts.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"label_counts\.parquet"):
        read_partition(out)
    assert not partition_is_current(out, part.hash)


def test_write_replaces_existing_partition_without_leftovers(
    written: tuple[Dataset, Partition, Path],
) -> None:
    data, _, out = written
    spec = dataclasses.replace(SPEC, seed=9)
    new = make_partition(data, spec)
    write_partition(new, data, out, spec)
    assert_same(read_partition(out, expected_hash=new.hash), new)
    assert [p.name for p in out.parent.iterdir()] == ["toy"]


def test_failed_write_leaves_existing_partition_untouched(
    written: tuple[Dataset, Partition, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    data, old, out = written
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = {"n": 0}
    real_write = pl.DataFrame.write_parquet

    def flaky_write(self: pl.DataFrame, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:  # after assignments.parquet is written
            raise OSError("disk full")
        real_write(self, *args, **kwargs)

    monkeypatch.setattr(pl.DataFrame, "write_parquet", flaky_write)
    spec = dataclasses.replace(SPEC, seed=9)
    with pytest.raises(OSError, match="disk full"):
        write_partition(make_partition(data, spec), data, out, spec)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in out.parent.iterdir()] == ["toy"]  # no temp dirs left
    assert_same(read_partition(out, expected_hash=old.hash), old)


def test_write_refuses_partition_of_other_spec(tmp_path: Path) -> None:
    data = toy()
    part = make_partition(data, SPEC)
    with pytest.raises(ValueError, match="does not match"):
        write_partition(part, data, tmp_path / "p", dataclasses.replace(SPEC, seed=5))
    assert not (tmp_path / "p").exists() and list(tmp_path.iterdir()) == []


# --- validation split ---------------------------------------------------------------------


def test_validation_split_replaces_test_rows_and_never_holds_one() -> None:
    data = toy(n=600)
    plain = make_partition(data, SPEC)
    tuned = make_partition(data, dataclasses.replace(SPEC, validation_fraction=0.2))
    assert tuned.hash != plain.hash
    for train, val, full_train, test in zip(
        tuned.train, tuned.test, plain.train, plain.test, strict=True
    ):
        # the validation rows come out of the client's train rows; its test rows are gone
        np.testing.assert_array_equal(np.sort(np.concatenate([train, val])), full_train)
        assert not set(val.tolist()) & set(test.tolist())
        assert not set(train.tolist()) & set(test.tolist())
        assert len(val) == int(np.floor(0.2 * len(full_train) + 0.5))
    again = make_partition(data, dataclasses.replace(SPEC, validation_fraction=0.2))
    assert_same(tuned, again)


def test_validation_fraction_zero_keeps_the_hash_and_bad_values_are_refused() -> None:
    assert "validation_fraction" not in SPEC.to_dict()
    same = dataclasses.replace(SPEC, validation_fraction=0.0)
    assert partition_hash("f", same) == partition_hash("f", SPEC)
    with pytest.raises(PartitionError, match="validation_fraction must be in"):
        dataclasses.replace(SPEC, validation_fraction=1.0)
