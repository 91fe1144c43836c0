"""MLflow tracking (``fedcomm.tracking`` is the only package of fedcomm that imports MLflow).

One MLflow run per (algorithm run, seed). The store defaults to SQLite at an *absolute* path
under the project root (``sqlite:////<root>/mlflow.db``) and artifacts to ``<root>/mlartifacts``,
so experiments queued with ``dvc exp run --queue`` (which execute in a temporary copy of the
repository inside its ``.dvc`` folder) log into the same store as the workspace.

Concurrency: a SQLite URI gets a connection busy timeout (``?timeout=60``, seconds; MLflow adds
its own per-session ``busy_timeout`` only after connecting), and :func:`init_store` creates or
migrates the schema under a file lock, so parallel workers (an Optuna sweep's) never race on the
migration of a fresh database. Against a tracking *server* (``http://...``, e.g. on PostgreSQL)
experiments take the server's artifact location instead of a local path.

A damaged store: every function here that opens a store first calls
:func:`fedcomm.tracking.store.check_store` (before MLflow touches it, so no run is opened), and a
store that is damaged, of another MLflow schema version, or (for readers) missing or empty raises
one :class:`~fedcomm.tracking.store.TrackingStoreError` naming the file and the remedy. A run id
the store does not hold (the store was replaced since it was logged) raises one too.

What the MLflow UI shows first: every experiment fedcomm creates or logs to is tagged
``mlflow.experimentKind: custom_model_development`` (model training, not a GenAI app: the UIs that
read the tag open it on its runs, not on the traces overview) and holds the saved view "fedcomm:
accuracy vs traffic" (:mod:`fedcomm.tracking.views`: the runs table's headline columns, accuracy
against GiB first among the charts); each training run logs its partition as a dataset input
(:mod:`fedcomm.tracking.inputs`, the runs table's Dataset column). MLflow 3.17's UI takes the kind
from its own GenAI / Model training switch instead (remembered per browser, GenAI at first):
``fedcomm ui`` serves it with model training as a new browser's default
(:mod:`fedcomm.tracking.ui_app`), and :func:`runs_page` is the link that opens on the runs in any
UI.

Each round's accuracies are logged twice: at step = the round (``global/accuracy``, ...) and at
step = the traffic so far in KiB (``accuracy_vs_KiB/global``, ...; and simulated seconds with a
``train.system`` section): :func:`~fedcomm.tracking.views.traffic_series`, the run page's first
charts.

A run's name is ``<run>-s<seed>``, and the DVC experiment that trained it in parentheses
(:func:`run_title`).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, Run, RunTag
from mlflow.exceptions import MlflowException

from fedcomm.atomic import file_lock
from fedcomm.errors import interrupts_deferred
from fedcomm.paths import project_root
from fedcomm.tracking.inputs import PartitionInput, log_partition_input
from fedcomm.tracking.store import SQLITE_TIMEOUT_S, TrackingStoreError, check_store, sqlite_path
from fedcomm.tracking.views import ensure_view, traffic_series

MAX_PARAM_LEN = 6000
PARENT_TAG = "mlflow.parentRunId"  # what makes a run nested in the MLflow UI
DVC_EXP_TAG = "dvc.exp_name"  # the DVC experiment that trained a run ("" outside one)
KIND_TAG = "mlflow.experimentKind"  # the experiment tag MLflow's UI reads for the experiment's kind
MODEL_TRAINING = "custom_model_development"  # its value for model training ("Machine learning")
# kinds the UI only inferred, or none: replaced; a kind someone chose (e.g. GenAI) is kept
_INFERRED_KINDS = frozenset(
    {"", "genai_development_inferred", "custom_model_development_inferred", "no_inferred_type"}
)


def dvc_exp_name() -> str:
    """The DVC experiment this process runs in (``$DVC_EXP_NAME``, "" outside one): the value
    of a run's :data:`DVC_EXP_TAG`."""
    return os.environ.get("DVC_EXP_NAME", "")


def resolve_tracking_uri(uri: str | None, root: Path | None = None) -> str:
    """``uri`` if set (a relative sqlite path is made absolute against the project root), else
    ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<root>/mlflow.db``. A SQLite URI without a
    ``timeout`` gets ``?timeout=60`` (seconds a connection waits on a locked database)."""
    base = project_root() if root is None else root
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        uri = f"sqlite:///{(base / 'mlflow.db').as_posix()}"
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri[len(prefix) :].startswith("/"):
        uri = f"{prefix}{(base / uri[len(prefix) :]).as_posix()}"
    if uri.startswith("sqlite:") and "timeout=" not in uri:
        uri += ("&" if "?" in uri else "?") + f"timeout={SQLITE_TIMEOUT_S}"
    return uri


def is_server(uri: str) -> bool:
    """A tracking server (it decides where artifacts go), not a local database."""
    return uri.startswith(("http://", "https://"))


@contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """An exclusive lock beside a SQLite store (a no-op for other stores)."""
    db = sqlite_path(uri)
    if db is None:
        yield
        return
    with file_lock(db.with_name(db.name + ".lock")):
        yield


def init_store(uri: str | None, experiment: str | None = None) -> str:
    """Create (or migrate) the tracking store and ``experiment`` once, under a lock: what
    parallel workers call before logging. Returns the resolved URI.

    Raises:
        TrackingStoreError: a damaged store, or one of another MLflow schema version.
    """
    resolved = resolve_tracking_uri(uri)
    with _store_lock(resolved):
        check_store(resolved, create=True)
        client = MlflowClient(tracking_uri=resolved)
        if experiment is not None:
            _experiment_id(client, experiment, project_root())
        else:
            client.search_experiments(max_results=1)
    return resolved


def open_client(uri: str | None, *, create: bool, root: Path | None = None) -> MlflowClient:
    """An MLflow client on the (resolved) store, which :func:`check_store` passed first.

    Args:
        uri: tracking URI, as for :func:`resolve_tracking_uri`.
        create: a missing or empty store may be created (a writer starting runs); readers pass
            ``False``: a store without runs is then an error, not a new empty store.
        root: project root (default :func:`~fedcomm.paths.project_root`).

    Raises:
        TrackingStoreError: the store is damaged, of another schema version, or (``create``
            unset) missing or empty; the message names the file and the remedy.
    """
    resolved = resolve_tracking_uri(uri, root)
    check_store(resolved, create=create)
    return MlflowClient(tracking_uri=resolved)


def require_run(client: MlflowClient, run_id: str, remedy: str) -> Run:
    """Run ``run_id``; :class:`TrackingStoreError` if the store of ``client`` does not hold it."""
    try:
        return client.get_run(run_id)
    except MlflowException as err:
        if err.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        uri = client.tracking_uri
        where = sqlite_path(uri) or uri
        raise TrackingStoreError(
            f"{where}: has no MLflow run {run_id} (the store was replaced or recreated since the "
            f"run was logged); {remedy}"
        ) from None


def artifact_location(root: Path | None = None) -> str:
    """Local artifact root for experiments created in a local store."""
    base = project_root() if root is None else root
    return (base / "mlartifacts").as_uri()


#: Every write to the store finishes whole: a Ctrl-C that lands inside one waits until it is
#: done. Cut inside a write, MLflow's SQLite session is left holding the database's write lock
#: (its cleanup catches ``Exception``, not ``KeyboardInterrupt``) until the interrupted
#: connection is garbage-collected, so the run's own ``KILLED`` and every later write of the
#: process wait 20 s and fail "database is locked" (a sweep then failed its next trials).
whole_write = interrupts_deferred


@dataclass
class MlflowTracker:
    """A handle on one MLflow run; every call goes through an explicit client, and every write
    finishes whole (:data:`whole_write`)."""

    client: MlflowClient
    run_id: str
    last_logged_round: int = 0  # rounds <= this were logged before a resume: not logged again

    @whole_write()
    def log_round(self, round_: int, metrics: Mapping[str, float | None]) -> None:
        """One batch per round (``step`` = round), plus the round's accuracies again against
        traffic and simulated time (:func:`traffic_series`); NaN/None values are skipped."""
        if round_ <= self.last_logged_round:
            return
        ts = int(time.time() * 1000)
        batch = [
            Metric(key, float(v), ts, round_)
            for key, v in metrics.items()
            if v is not None and not math.isnan(float(v))
        ]
        batch += [Metric(key, value, ts, step) for key, value, step in traffic_series(metrics)]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000], synchronous=True)

    @whole_write()
    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None:
        ts = int(time.time() * 1000)
        batch = [Metric(k, float(v), ts, step) for k, v in metrics.items() if _finite(v)]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000], synchronous=True)

    @whole_write()
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path)

    @whole_write()
    def log_dict(self, data: dict[str, Any], artifact_file: str) -> None:
        self.client.log_dict(self.run_id, data, artifact_file)

    @whole_write()
    def set_tags(self, tags: Mapping[str, str]) -> None:
        self.client.log_batch(
            self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()], synchronous=True
        )

    @whole_write()
    def finish(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status)


def _finite(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))


@whole_write()
def _experiment_id(client: MlflowClient, name: str, root: Path) -> str:
    """The id of experiment ``name``, created if needed; :func:`prepare_experiment` either way."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        prepare_experiment(client, str(exp.experiment_id), exp.tags)
        return str(exp.experiment_id)
    location = None if is_server(client.tracking_uri) else artifact_location(root)
    try:
        exp_id = str(
            client.create_experiment(
                name, artifact_location=location, tags={KIND_TAG: MODEL_TRAINING}
            )
        )
    except Exception:  # created concurrently by another process
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        prepare_experiment(client, str(exp.experiment_id), exp.tags)
        return str(exp.experiment_id)
    ensure_view(client, exp_id, {})
    return exp_id


@whole_write()
def prepare_experiment(
    client: MlflowClient, experiment_id: str, tags: Mapping[str, str] | None = None
) -> None:
    """What every experiment fedcomm logs to gets: the model-training kind
    (:func:`mark_model_training`) and the saved view "fedcomm: accuracy vs traffic"
    (:func:`~fedcomm.tracking.views.ensure_view`). ``tags``: its tags, if already fetched."""
    if tags is None:
        tags = client.get_experiment(experiment_id).tags
    mark_model_training(client, experiment_id, tags)
    ensure_view(client, experiment_id, tags)


def mark_model_training(
    client: MlflowClient, experiment_id: str, tags: Mapping[str, str] | None = None
) -> bool:
    """Tag experiment ``experiment_id`` ``mlflow.experimentKind: custom_model_development``
    unless it has a kind someone chose (an experiment an older fedcomm created has none).
    ``tags``: its tags, if already fetched. Whether it was tagged."""
    if tags is None:
        tags = client.get_experiment(experiment_id).tags
    if tags.get(KIND_TAG, "") not in _INFERRED_KINDS:
        return False
    client.set_experiment_tag(experiment_id, KIND_TAG, MODEL_TRAINING)
    return True


def runs_page(ui_url: str, experiment_id: str) -> str:
    """The MLflow UI's page of an experiment's runs (``ui_url``: where ``mlflow ui`` or the
    tracking server listens, e.g. ``http://127.0.0.1:5000``), in its model-training view even where
    the browser last used the GenAI one (MLflow 3.17's UI reads ``workflowType``, not the tag)."""
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?workflowType=machine_learning"


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mapping -> ``{"a.b.c": "value"}`` (MLflow params)."""
    out: dict[str, str] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)[:MAX_PARAM_LEN]
    return out


def run_title(run_name: str, tags: Mapping[str, str]) -> str:
    """The MLflow run's name: ``run_name`` (``<run>-s<seed>``), and the DVC experiment that
    trained it (tag ``dvc.exp_name``, set by ``dvc exp run``) in parentheses, so that runs of
    different DVC experiments in one MLflow experiment differ: ``fedavg-s0 (lr-0.3)``."""
    exp = tags.get(DVC_EXP_TAG, "").strip()
    return f"{run_name} ({exp})" if exp else run_name


@whole_write()
def open_run(
    *,
    uri: str | None,
    experiment: str,
    run_name: str,
    tags: Mapping[str, str],
    params: Mapping[str, Any],
    run_id: str | None = None,
    parent_run_id: str | None = None,
    dataset: PartitionInput | None = None,
) -> MlflowTracker:
    """Start a run, or reopen ``run_id`` (a resume) and find the last round it logged. With
    ``parent_run_id`` the new run is nested under it (a sweep trial under its study). With
    ``dataset`` the run has it as its one dataset input (a resumed run is not given it twice).
    The experiment (the resumed run's, on a resume) gets :func:`prepare_experiment`; a new run is
    named :func:`run_title` (``run_name``, and ``tags``' DVC experiment).

    Raises:
        TrackingStoreError: a damaged store or one of another MLflow schema version (checked
            before any run is opened), or a ``run_id`` the store does not hold.
    """
    root = project_root()
    client = open_client(uri, create=True, root=root)
    if run_id is not None:
        resumed = require_run(
            client,
            run_id,
            "restore the store that holds it, or train again without the checkpoint "
            "(`fedcomm train --no-resume`)",
        )
        prepare_experiment(client, str(resumed.info.experiment_id))
        if dataset is not None:
            log_partition_input(client, run_id, dataset)
        client.update_run(run_id, status="RUNNING")
        history = client.get_metric_history(run_id, "comm/cum_gib")
        last = max((m.step for m in history), default=0)
        tracker = MlflowTracker(client, run_id, last_logged_round=last)
        # e.g. the retried sweep trial's number, and its (new) trial run as the parent
        tracker.set_tags({**tags, PARENT_TAG: parent_run_id} if parent_run_id else tags)
        return tracker
    exp_id = _experiment_id(client, experiment, root)
    all_tags = {**tags, PARENT_TAG: parent_run_id} if parent_run_id else dict(tags)
    run = client.create_run(exp_id, run_name=run_title(run_name, tags), tags=all_tags)
    tracker = MlflowTracker(client, run.info.run_id)
    flat = flatten(params)
    items = [Param(k, v) for k, v in sorted(flat.items())]
    for i in range(0, len(items), 100):
        client.log_batch(tracker.run_id, params=items[i : i + 100], synchronous=True)
    tracker.log_dict(dict(params), "config.json")
    if dataset is not None:
        client.log_inputs(tracker.run_id, datasets=[dataset.entity()])
    return tracker


@whole_write()
def fail_if_running(uri: str | None, run_id: str, reason: str) -> bool:
    """Mark run ``run_id`` FAILED (tag ``fedcomm.stopped``: ``reason``) if it is still RUNNING:
    the run of a killed process whose checkpoint cannot be resumed. Whether it was marked.

    Raises:
        TrackingStoreError: a damaged store or one of another MLflow schema version.
    """
    client = open_client(uri, create=True)
    try:
        run = client.get_run(run_id)
    except MlflowException:
        return False
    if run.info.status != "RUNNING":
        return False
    client.set_tag(run_id, "fedcomm.stopped", reason)
    client.set_terminated(run_id, "FAILED")
    return True


def reopen(uri: str | None, run_id: str) -> MlflowTracker:
    """A handle on an existing run (the evaluate stage adds its summaries to the train run).

    Raises:
        TrackingStoreError: the store is missing, empty, damaged or of another MLflow schema
            version, or does not hold run ``run_id``.
    """
    client = open_client(uri, create=False)
    run = require_run(
        client, run_id, "restore the store that holds it, or train the run again (`fedcomm train`)"
    )
    prepare_experiment(client, str(run.info.experiment_id))
    return MlflowTracker(client, run_id, last_logged_round=0)


class NullTracker:
    """Tracking switched off (``tracking.enabled: false``): every call is a no-op."""

    run_id: str | None = None
    last_logged_round = 0

    def log_round(self, round_: int, metrics: Mapping[str, float | None]) -> None: ...
    def log_metrics(self, metrics: Mapping[str, float], step: int = 0) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def log_dict(self, data: dict[str, Any], artifact_file: str) -> None: ...
    def set_tags(self, tags: Mapping[str, str]) -> None: ...
    def finish(self, status: str = "FINISHED") -> None: ...
