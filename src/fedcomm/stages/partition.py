"""The partition stage: the dataset split over clients (``data/partition/``), and reading the
current partition back as the clients' tensors."""

from __future__ import annotations

from fedcomm.config import Params, keyed
from fedcomm.data.datasets.registry import load_dataset
from fedcomm.data.federated import Partition, PartitionSpec, make_partition, partition_hash
from fedcomm.data.partition_files import partition_is_current, read_partition, write_partition
from fedcomm.data.partitioners import PartitionError
from fedcomm.data.types import Dataset
from fedcomm.simulation.data import FederatedTensors
from fedcomm.stages.paths import Paths


def partition_spec(params: Params) -> PartitionSpec:
    cfg = params.partition
    fields = cfg.model_dump(
        exclude={"kind", "num_partitions", "test_fraction", "seed", "validation_fraction"}
    )
    return PartitionSpec(
        cfg.kind, cfg.num_partitions, fields, cfg.test_fraction, cfg.seed, cfg.validation_fraction
    )


def load_data(params: Params) -> Dataset:
    return load_dataset(params.data.dataset.name, params.data.root, **params.data.options())


def partition_stage(params: Params, paths: Paths = Paths()) -> str:
    """Partition the dataset over clients; returns the partition hash. Skips if current."""
    dataset = load_data(params)
    spec = partition_spec(params)
    expected = partition_hash(dataset.fingerprint(), spec)
    if not partition_is_current(paths.partition, expected):
        write_partition(draw_partition(params, dataset), dataset, paths.partition, spec)
    return expected


def draw_partition(params: Params, dataset: Dataset) -> Partition:
    """``make_partition`` for ``params.partition``; an error that starts with one of its keys
    ("num_partitions must be ...") names the full key (``partition.num_partitions: must be``)."""
    try:
        return make_partition(dataset, partition_spec(params))
    except PartitionError as err:
        named = keyed(str(err), ["partition"], type(params.partition).model_fields)
        if named is not None:
            raise PartitionError(named) from None
        raise


def load_federated(params: Params, paths: Paths) -> tuple[FederatedTensors, str]:
    """The client tensors of the current partition; refuses a stale partition."""
    dataset = load_data(params)
    expected = partition_hash(dataset.fingerprint(), partition_spec(params))
    part = read_partition(paths.partition, expected_hash=expected)
    return FederatedTensors.build(dataset, part.train, part.test), expected
