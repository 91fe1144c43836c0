"""What a training run was trained on, as an MLflow dataset input: the runs table's Dataset column.

A training run logs one metadata-only dataset input (no data: a partition can hold 60k images),
read from the partition's ``manifest.json``, context ``training``:

* name: ``<dataset> / <partition kind> <clients>``, e.g. ``mnist / dirichlet 100``;
* digest: the partition's content hash (``manifest.json``'s ``hash``), its first
  :data:`DIGEST_CHARS` hex characters, as fedcomm's own messages show it. MLflow's SQL stores keep
  a digest in 36 characters (a 64-character one fails on PostgreSQL), and its UI shows it beside
  the name; the whole hash is in the profile and in the run's ``partition_hash`` tag;
* source (type ``fedcomm_partition``): the dataset's registry name, its content fingerprint,
  where its data root was set (``data.root`` as written when relative, else the setting's name;
  never an absolute path) and the partition directory relative to the project root;
* profile: clients, rows, classes, the partition spec and the whole hash.

Runs of one partition share the MLflow dataset (same name and digest); a resumed run keeps the one
input it has (nothing is logged twice).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Dataset, DatasetInput, InputTag
from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

from fedcomm.data.datasets.verify import DATA_ROOT_ENV
from fedcomm.data.partition_files import MANIFEST
from fedcomm.errors import InputError

CONTEXT = "training"  # MLflow's dataset context tag: what the run used the data for
SOURCE_TYPE = "fedcomm_partition"  # at most 36 characters (MLflow's column)
DIGEST_CHARS = 12  # hex characters of the partition hash kept as the digest (MLflow: <= 36)
_REQUIRED = ("hash", "dataset", "num_clients", "num_rows", "num_classes", "spec")


@dataclass(frozen=True)
class PartitionInput:
    """One partition of one dataset, as a training run's MLflow dataset input.

    Attributes:
        dataset: the dataset's registry name (``mnist``).
        kind: the partitioner (``dirichlet``, ``lotteryfl``, ...).
        num_clients: clients of the partition.
        num_rows: examples in the dataset (every client's train and test rows come from them).
        num_classes: classes (the vocabulary size for next-token datasets).
        partition_hash: the partition's content hash, 64 hex characters.
        dataset_fingerprint: the dataset's content hash (sha256 of its inputs and targets).
        spec: the partition spec as the manifest holds it (kind, clients, seed, parameters).
        data_root: where the data root was set (no absolute path; see :func:`data_root_label`).
        partition_dir: the partition directory, relative to the project root (POSIX).
    """

    dataset: str
    kind: str
    num_clients: int
    num_rows: int
    num_classes: int
    partition_hash: str
    dataset_fingerprint: str
    spec: Mapping[str, Any] = field(default_factory=dict)
    data_root: str = ""
    partition_dir: str = ""

    @property
    def name(self) -> str:
        """What the runs table shows, e.g. ``cifar10 / lotteryfl 400``."""
        return f"{self.dataset} / {self.kind} {self.num_clients}"

    @property
    def digest(self) -> str:
        return self.partition_hash[:DIGEST_CHARS]

    def source(self) -> dict[str, str]:
        return {
            "dataset": self.dataset,
            "dataset_fingerprint": self.dataset_fingerprint,
            "data_root": self.data_root,
            "partition": self.partition_dir,
        }

    def profile(self) -> dict[str, Any]:
        return {
            "num_clients": self.num_clients,
            "num_rows": self.num_rows,
            "num_classes": self.num_classes,
            "partition": dict(self.spec),
            "partition_hash": self.partition_hash,
        }

    def entity(self) -> DatasetInput:
        """The MLflow dataset input (context ``training``), metadata only."""
        dataset = Dataset(
            name=self.name,
            digest=self.digest,
            source_type=SOURCE_TYPE,
            source=json.dumps(self.source(), sort_keys=True),
            profile=json.dumps(self.profile(), sort_keys=True),
        )
        return DatasetInput(dataset, tags=[InputTag(MLFLOW_DATASET_CONTEXT, CONTEXT)])


def data_root_label(root: str | None) -> str:
    """Where the data root was set, without an absolute path: ``data.root`` as written when it
    is relative, ``data.root`` when it is absolute, ``$FEDCOMM_DATA_ROOT`` when only the
    environment sets it, ``""`` when nothing does (a dataset without files, e.g. ``digits``)."""
    if root:
        return "data.root" if Path(root).expanduser().is_absolute() else Path(root).as_posix()
    return f"${DATA_ROOT_ENV}" if os.environ.get(DATA_ROOT_ENV) else ""


def partition_input(
    partition_dir: Path, *, data_root: str | None, root: Path | None = None
) -> PartitionInput:
    """The dataset input of the partition in ``partition_dir`` (its ``manifest.json``).

    Args:
        partition_dir: the partition directory (``data/partition``), already checked by the
            train stage (complete, current).
        data_root: ``data.root`` of the params (``None``: not set).
        root: the directory the partition directory is shown relative to (default: the working
            directory, the project's copy a stage runs in; a DVC queued experiment's copy too).

    Raises:
        InputError: the manifest cannot be read or lacks a key (the message names the file).
    """
    path = partition_dir / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(
            f"{path}: cannot be read ({type(err).__name__}); run `fedcomm partition` again"
        ) from None
    missing = [key for key in _REQUIRED if not isinstance(manifest, dict) or key not in manifest]
    spec = manifest.get("spec") if isinstance(manifest, dict) else None
    if not missing and not (isinstance(spec, dict) and "kind" in spec):
        missing = ["spec.kind"]
    if missing or not isinstance(spec, dict):
        raise InputError(
            f"{path}: lacks {', '.join(missing)} (written by another fedcomm version?); run "
            "`fedcomm partition` again"
        )
    base = Path.cwd() if root is None else root
    return PartitionInput(
        dataset=str(manifest["dataset"]),
        kind=str(spec["kind"]),
        num_clients=int(manifest["num_clients"]),
        num_rows=int(manifest["num_rows"]),
        num_classes=int(manifest["num_classes"]),
        partition_hash=str(manifest["hash"]),
        dataset_fingerprint=str(manifest.get("dataset_fingerprint", "")),
        spec=spec,
        data_root=data_root_label(data_root),
        partition_dir=Path(os.path.relpath(partition_dir.absolute(), base.absolute())).as_posix(),
    )


def log_partition_input(client: MlflowClient, run_id: str, part: PartitionInput) -> bool:
    """Log ``part`` as run ``run_id``'s dataset input unless the run has it already (a resumed
    run). Whether it was logged."""
    run = client.get_run(run_id)
    held = run.inputs.dataset_inputs if run.inputs is not None else []
    if any(d.dataset.name == part.name and d.dataset.digest == part.digest for d in held):
        return False
    client.log_inputs(run_id, datasets=[part.entity()])
    return True
