"""``fedcomm ui``: the MLflow UI on the project's store, and a link to each experiment's view.

It runs ``mlflow ui --app-name fedcomm`` (:mod:`fedcomm.tracking.ui_app`): MLflow's own server,
whose UI opens a new browser on its model-training layout (MLflow 3.17 reads the layout from the
browser, GenAI at first, not from the experiment's ``mlflow.experimentKind`` tag), so the run
pages opened from the runs table are model-training pages too. The links printed open each
experiment's saved view "fedcomm: accuracy vs traffic" (:mod:`fedcomm.tracking.views`, written
into experiments that lack it): the runs table with the algorithm, the headline metrics
(``final_acc``, ``up_gib``, ``down_gib``, ...), the DVC experiment and the partition (Dataset);
its chart view (the button beside the table's) draws accuracy against GiB first. The links also
carry ``workflowType=machine_learning``, for a UI served otherwise.

Against a tracking server (``http://...``) nothing is started: the links point at the server.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import entry_points

from mlflow import MlflowClient

from fedcomm.tracking.mlflow import is_server, open_client, resolve_tracking_uri
from fedcomm.tracking.views import ensure_view, view_page

HOST = "127.0.0.1"  # loopback only, as `mlflow ui`
PORT = 5000  # `mlflow ui`'s default
APP_NAME = "fedcomm"  # pyproject's entry point in group mlflow.app: fedcomm.tracking.ui_app


def ui_url(uri: str, host: str = HOST, port: int = PORT) -> str:
    """Where the UI of the (resolved) store ``uri`` is: the server itself, or ``mlflow ui``."""
    return uri.rstrip("/") if is_server(uri) else f"http://{host}:{port}"


def experiment_pages(client: MlflowClient, base: str) -> list[tuple[str, str]]:
    """``(experiment name, its saved view's page)`` for each active experiment holding runs, by
    name; the view is written into those that lack it (:func:`~fedcomm.tracking.views.ensure_view`:
    experiments of an older fedcomm, or of another tool)."""
    pages = []
    token: str | None = None
    while True:
        page = client.search_experiments(page_token=token)
        for exp in page:
            if client.search_runs([exp.experiment_id], max_results=1):
                ensure_view(client, str(exp.experiment_id), exp.tags)
                pages.append((exp.name, view_page(base, str(exp.experiment_id))))
        token = page.token
        if not token:
            return sorted(pages)


def app_installed() -> bool:
    """Whether ``mlflow ui`` finds the ``fedcomm`` app: an install of fedcomm that predates it
    (``pip install -e .`` not run again) lacks its entry point."""
    return bool(entry_points(group="mlflow.app", name=APP_NAME))


def ui_command(uri: str, host: str = HOST, port: int = PORT, *, app: bool = True) -> list[str]:
    """``mlflow ui --app-name fedcomm`` (:mod:`fedcomm.tracking.ui_app`; ``app`` unset: MLflow's
    own app) on the (resolved, local) store ``uri``, one worker (the UI is one user's)."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
        *(["--app-name", APP_NAME] if app else []),
        "--backend-store-uri",
        uri,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def serve(
    uri: str | None, *, host: str = HOST, port: int = PORT, echo: Callable[[str], None] = print
) -> int:
    """Print each experiment's saved view's page, then run ``mlflow ui --app-name fedcomm`` on
    the store until it stops (Ctrl-C); against a tracking server, only print. Returns the exit
    status. Where the app is not installed (:func:`app_installed`), MLflow's own app, and a line
    that says so.

    Raises:
        TrackingStoreError: the store is missing, empty, damaged or of another schema version.
    """
    resolved = resolve_tracking_uri(uri)
    client = open_client(uri, create=False)
    base = ui_url(resolved, host, port)
    pages = experiment_pages(client, base)
    echo(f"MLflow UI: {base}" + ("" if is_server(resolved) else " (Ctrl-C stops it)"))
    for name, link in pages:
        echo(f"  {name}: {link}")
    if not pages:
        echo("  (no runs yet: `fedcomm train` logs them)")
    if is_server(resolved):
        return 0
    app = app_installed()
    if not app:
        echo(
            "  note: `mlflow ui --app-name fedcomm` is not installed (`pip install -e .` installs "
            "it): a new browser opens run pages in MLflow's GenAI layout"
        )
    proc = subprocess.Popen(ui_command(resolved, host, port, app=app))
    previous = signal.signal(signal.SIGTERM, _stop)  # `kill` ends the UI too, not only Ctrl-C
    try:
        return proc.wait()
    except (KeyboardInterrupt, SystemExit):
        return 0
    finally:
        signal.signal(signal.SIGTERM, previous)
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
