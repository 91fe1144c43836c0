"""``fedcomm ui``: the MLflow UI on the project's store, and a link to each experiment's runs.

MLflow 3.17's UI opens an experiment on the view its GenAI / Model training switch (top left)
last showed in this browser: GenAI at first (traces, token usage), whatever the experiment's
``mlflow.experimentKind`` tag says. The links printed here carry ``workflowType=machine_learning``
(:func:`fedcomm.tracking.mlflow.runs_page`), so they open on the runs table, whose Dataset column
names each run's partition.

Against a tracking server (``http://...``) nothing is started: the links point at the server.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable

from mlflow import MlflowClient

from fedcomm.tracking.mlflow import is_server, open_client, resolve_tracking_uri, runs_page

HOST = "127.0.0.1"  # loopback only, as `mlflow ui`
PORT = 5000  # `mlflow ui`'s default


def ui_url(uri: str, host: str = HOST, port: int = PORT) -> str:
    """Where the UI of the (resolved) store ``uri`` is: the server itself, or ``mlflow ui``."""
    return uri.rstrip("/") if is_server(uri) else f"http://{host}:{port}"


def experiment_pages(client: MlflowClient, base: str) -> list[tuple[str, str]]:
    """``(experiment name, runs page)`` for each active experiment holding runs, by name."""
    pages = []
    token: str | None = None
    while True:
        page = client.search_experiments(page_token=token)
        for exp in page:
            if client.search_runs([exp.experiment_id], max_results=1):
                pages.append((exp.name, runs_page(base, str(exp.experiment_id))))
        token = page.token
        if not token:
            return sorted(pages)


def ui_command(uri: str, host: str = HOST, port: int = PORT) -> list[str]:
    """``mlflow ui`` on the (resolved, local) store ``uri``, one worker (the UI is one user's)."""
    return [
        sys.executable,
        "-m",
        "mlflow",
        "ui",
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
    """Print each experiment's runs page, then run ``mlflow ui`` on the store until it stops
    (Ctrl-C); against a tracking server, only print. Returns the exit status.

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
    proc = subprocess.Popen(ui_command(resolved, host, port))
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
