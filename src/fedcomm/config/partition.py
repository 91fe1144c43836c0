"""``partition``: how the data is split over clients (a discriminated union on ``kind``, one
config per partitioner of ``fedcomm.data.partitioners``, whose parameters are its keys)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from fedcomm.config.base import Strict


class _Partition(Strict):
    test_fraction: float = Field(0.2, ge=0, lt=1, description="per-client test share")
    seed: int = Field(0, ge=0)
    validation_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="share of each client's train rows held out for tuning; when > 0 they are "
        "evaluated in place of the test rows, which are then never read",
    )


class IidPartition(_Partition):
    kind: Literal["iid"] = "iid"
    num_partitions: int = Field(ge=1)
    shuffle: bool = True


class DirichletPartition(_Partition):
    kind: Literal["dirichlet"] = "dirichlet"
    num_partitions: int = Field(ge=1)
    alpha: float | list[float] = 0.5
    min_partition_size: int = Field(10, ge=0)
    self_balancing: bool = False
    shuffle: bool = True
    max_retries: int = Field(10, ge=1)

    @model_validator(mode="after")
    def _alpha_positive(self) -> DirichletPartition:
        alphas = self.alpha if isinstance(self.alpha, list) else [self.alpha]
        if any(a <= 0 for a in alphas):
            raise ValueError(f"alpha must be > 0 (got {self.alpha})")
        if isinstance(self.alpha, list) and len(self.alpha) != self.num_partitions:
            raise ValueError(
                f"alpha as a list needs num_partitions={self.num_partitions} entries, "
                f"got {len(self.alpha)}"
            )
        return self


class PathologicalPartition(_Partition):
    kind: Literal["pathological"] = "pathological"
    num_partitions: int = Field(ge=1)
    num_classes_per_partition: int = Field(ge=1)
    class_assignment_mode: Literal["random", "deterministic", "first-deterministic"] = (
        "first-deterministic"
    )
    shuffle: bool = True


class ShardPartition(_Partition):
    kind: Literal["shard"] = "shard"
    num_partitions: int = Field(ge=1)
    num_shards_per_partition: int | None = Field(None, ge=1)
    shard_size: int | None = Field(None, ge=1)
    keep_incomplete_shard: bool = False
    shuffle: bool = True


class SizePartition(_Partition):
    kind: Literal["size"] = "size"
    num_partitions: int = Field(ge=1)
    partition_sizes: list[int] | None = None
    sigma: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_of(self) -> SizePartition:
        if (self.partition_sizes is None) == (self.sigma is None):
            raise ValueError("set exactly one of partition_sizes and sigma")
        return self


class LabelCyclePartition(_Partition):
    """pFedBayes / FedBIAD Table I scheme: client k holds labels (k·s + j) mod C, j < n_l, with
    s = ``client_stride`` (default n_l, as pFedBayes' code; 1 is pFedMe's sliding window)."""

    kind: Literal["label_cycle"] = "label_cycle"
    num_partitions: int = Field(ge=1)
    labels_per_partition: int = Field(5, ge=1)
    client_stride: int | None = Field(
        None, ge=1, description="s in (k·s + j) mod C; None: s = n_l (pFedBayes' code)"
    )
    shuffle: bool = True


class LotteryflPartition(_Partition):
    """FedDST's AAAI-era LotteryFL split: 2 label-sorted shards of 20 train rows per client,
    and ``test_per_class`` test rows of each class it holds (shared between holders)."""

    kind: Literal["lotteryfl"] = "lotteryfl"
    num_partitions: int = Field(ge=1)
    test_fraction: float = Field(0.0, description="must be 0: test rows are drawn per class")
    shards_per_client: int = Field(2, ge=1)
    shard_size: int = Field(20, ge=1)
    test_per_class: int = Field(100, ge=1)
    shuffle: bool = True

    @model_validator(mode="after")
    def _no_test_fraction(self) -> LotteryflPartition:
        if self.test_fraction != 0:
            raise ValueError(
                f"test_fraction must be 0 for lotteryfl (got {self.test_fraction}): each client "
                "tests on test_per_class rows of each class it holds"
            )
        return self


class NaturalIdPartition(_Partition):
    kind: Literal["natural_id"] = "natural_id"
    num_partitions: int | None = Field(None, ge=1, description="keep the first K natural ids")


PartitionConfig = Annotated[
    IidPartition
    | DirichletPartition
    | PathologicalPartition
    | ShardPartition
    | SizePartition
    | LabelCyclePartition
    | LotteryflPartition
    | NaturalIdPartition,
    Field(discriminator="kind"),
]
