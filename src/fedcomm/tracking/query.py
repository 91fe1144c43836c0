"""Read-only queries on the MLflow store: find training runs and fetch their tables.

A *training run* is an MLflow run made by :func:`fedcomm.stages.train.train_stage`: it has a
``run`` tag (the algorithm run key) and a ``rounds.parquet`` artifact at its root. Other runs in
the same experiments (a sweep's parent ``study`` run, its ``trial`` runs, anything logged by hand)
are skipped. Nothing here writes to the store.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.exceptions import MlflowException

from fedcomm.config import ConfigError
from fedcomm.tracking.mlflow import DVC_EXP_TAG, open_client

TABLES = ("rounds.parquet", "ledger.parquet", "clients.parquet")
KIND_TAG = "fedcomm.kind"  # "study" / "trial" on sweep runs; absent or "train" on training runs
SEED_PARAM = "seed"  # the one param that varies between the runs of one configuration
_PAGE = 1000  # runs per search page (MLflow's default page size)
_PROGRESS_ENV = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"


@dataclass(frozen=True)
class RunRecord:
    """One training run found in the store.

    Attributes:
        run_id: the MLflow run id.
        experiment: name of its MLflow experiment.
        run_name: the MLflow run name (``<run>-s<seed>``).
        tags: its tags (MLflow's own ``mlflow.*`` tags included).
        start_time_ms: start time, milliseconds since the Unix epoch.
        status: ``FINISHED``, ``RUNNING``, ``FAILED`` or ``KILLED``.
        artifacts: names of the files at its artifact root.
        params: its MLflow params: the resolved run configuration, flattened (``algorithm.mu``,
            ``train.local.lr``, ..., ``seed``).
    """

    run_id: str
    experiment: str
    run_name: str
    tags: dict[str, str]
    start_time_ms: int
    status: str
    artifacts: frozenset[str] = field(default_factory=frozenset)
    params: dict[str, str] = field(default_factory=dict)

    @property
    def config_key(self) -> str:
        """sha256 of the logged configuration without the seed: the seeds of one configuration
        share it ("" for a run logged without params)."""
        if not self.params:
            return ""
        blob = json.dumps({k: v for k, v in self.params.items() if k != SEED_PARAM}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    @property
    def seed(self) -> int | None:
        """The ``seed`` tag as an int (``None`` if absent or not an integer)."""
        try:
            return int(self.tags["seed"])
        except (KeyError, ValueError):
            return None


def _quote(value: str) -> str:
    """``value`` as an MLflow filter string literal (MLflow has no escapes: pick a quote)."""
    if "'" not in value:
        return f"'{value}'"
    if '"' not in value:
        return f'"{value}"'
    raise ConfigError(f"tag value {value!r}: cannot contain both ' and \" in an MLflow filter")


def run_filter(
    tags: Mapping[str, str], *, dvc_exp: str | None = None, status: str | None = "FINISHED"
) -> str:
    """The MLflow ``filter_string``: every tag equal to its value, the DVC experiment name (tag
    ``dvc.exp_name``) and the run status, joined by ``and``; ``""`` matches every run.

    Raises:
        ConfigError: a tag key containing a backtick, or a value containing both quote kinds.
    """
    wanted = dict(tags)
    if dvc_exp is not None:
        wanted[DVC_EXP_TAG] = dvc_exp
    clauses = []
    for key, value in wanted.items():
        if "`" in key or not key:
            raise ConfigError(f"tag key {key!r}: must be non-empty and contain no backtick")
        clauses.append(f"tags.`{key}` = {_quote(value)}")
    if status is not None:
        clauses.append(f"attributes.status = {_quote(status)}")
    return " and ".join(clauses)


def _experiment_ids(client: MlflowClient, names: Sequence[str]) -> dict[str, str]:
    """``{experiment id: name}`` for ``names`` (every active experiment when empty).

    Raises:
        ConfigError: a name that is not an experiment of the store (the message lists them).
    """
    existing: dict[str, str] = {}
    token: str | None = None
    while True:
        page = client.search_experiments(page_token=token)
        existing.update({str(e.experiment_id): e.name for e in page})
        token = page.token
        if not token:
            break
    if not names:
        return existing
    by_name = {name: eid for eid, name in existing.items()}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ConfigError(
            f"experiment: {', '.join(map(repr, unknown))} not found in the MLflow store "
            f"(existing: {', '.join(sorted(by_name)) or 'none'})"
        )
    return {by_name[n]: n for n in dict.fromkeys(names)}


def _search(client: MlflowClient, experiment_ids: list[str], filter_string: str) -> Iterator[Run]:
    """Every run matching ``filter_string``, following the page tokens."""
    token: str | None = None
    while True:
        page = client.search_runs(
            experiment_ids, filter_string, max_results=_PAGE, page_token=token
        )
        yield from page
        token = page.token
        if not token:
            return


def _is_training_run(run: Run) -> bool:
    """A ``run`` tag and no ``fedcomm.kind`` other than ``train`` (artifacts checked later)."""
    tags = run.data.tags
    return "run" in tags and tags.get(KIND_TAG, "train") == "train"


def find_runs(
    uri: str | None,
    *,
    experiments: Sequence[str] = (),
    tags: Mapping[str, str] | None = None,
    dvc_exp: str | None = None,
    status: str | None = "FINISHED",
) -> list[RunRecord]:
    """The training runs matching every filter, oldest first.

    Args:
        uri: tracking URI (``None``: ``$MLFLOW_TRACKING_URI`` or the project's ``mlflow.db``).
        experiments: MLflow experiment names; empty means every active experiment.
        tags: tag key -> required value (e.g. ``{"run": "fedavg"}``).
        dvc_exp: required value of the ``dvc.exp_name`` tag (a DVC experiment's name).
        status: required run status (``None``: any).

    Returns:
        One :class:`RunRecord` per training run: runs without a ``run`` tag or without a
        ``rounds.parquet`` artifact, and runs tagged ``fedcomm.kind`` other than ``train``
        (sweep studies and trials), are left out.

    Raises:
        ConfigError: an unknown experiment name or a tag filter MLflow cannot express.
        TrackingStoreError: the store is missing, empty, damaged or of another MLflow schema
            version (nothing is created).
    """
    client = open_client(uri, create=False)
    names = _experiment_ids(client, experiments)
    if not names:
        return []
    filter_string = run_filter(tags or {}, dvc_exp=dvc_exp, status=status)
    records = []
    for run in _search(client, list(names), filter_string):
        if not _is_training_run(run):
            continue
        artifacts = frozenset(f.path for f in client.list_artifacts(run.info.run_id))
        if TABLES[0] not in artifacts:
            continue
        records.append(
            RunRecord(
                run_id=run.info.run_id,
                experiment=names[str(run.info.experiment_id)],
                run_name=run.info.run_name or "",
                tags=dict(run.data.tags),
                start_time_ms=int(run.info.start_time or 0),
                status=str(run.info.status),
                artifacts=artifacts,
                params=dict(run.data.params),
            )
        )
    return sorted(records, key=lambda r: (r.start_time_ms, r.run_id))


@contextmanager
def _quiet_downloads() -> Iterator[None]:
    """Turn MLflow's per-download progress bars off (unless the user set the variable)."""
    if _PROGRESS_ENV in os.environ:
        yield
        return
    os.environ[_PROGRESS_ENV] = "false"
    try:
        yield
    finally:
        os.environ.pop(_PROGRESS_ENV, None)


def download_tables(
    uri: str | None, run_id: str, dest: Path, names: Sequence[str] = TABLES
) -> dict[str, Path]:
    """Copy artifacts at the root of run ``run_id`` into ``dest`` (created if needed).

    Args:
        uri: tracking URI, as for :func:`find_runs`.
        run_id: the MLflow run.
        dest: local directory receiving the files.
        names: artifact file names (default: the ``rounds``, ``ledger`` and ``clients`` tables).

    Returns:
        ``{name: local path}``.

    Raises:
        ConfigError: an artifact the run does not have.
        TrackingStoreError: the store is missing, empty, damaged or of another MLflow schema
            version.
    """
    client = open_client(uri, create=False)
    dest.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    with _quiet_downloads():
        for name in names:
            try:
                out[name] = Path(client.download_artifacts(run_id, name, str(dest)))
            except MlflowException as err:
                raise ConfigError(
                    f"MLflow run {run_id}: cannot download artifact {name!r} ({err.message})"
                ) from None
    return out
