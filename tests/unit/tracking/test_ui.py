"""``fedcomm ui`` without a browser: the links it prints (each experiment's saved view, written
where missing), the ``mlflow ui`` it runs, and its one-line error on a missing store (the UI itself
is opened in Chromium by ``test_mlflow_ui.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

from mlflow import MlflowClient
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.tracking.ui import app_installed, experiment_pages, ui_command, ui_url
from fedcomm.tracking.views import VIEW_TAG


def test_each_experiment_with_runs_gets_its_view(store: Path) -> None:
    client = MlflowClient(f"sqlite:///{store / 'mlflow.db'}")
    ids = {name: client.create_experiment(name) for name in ("b", "a", "empty")}
    for name in ("a", "b"):
        client.create_run(ids[name])
    query = "workflowType=machine_learning&viewStateShareKey=fedcomm-accuracy-vs-traffic"
    assert experiment_pages(client, "http://127.0.0.1:5001") == [
        ("a", f"http://127.0.0.1:5001/#/experiments/{ids['a']}/runs?{query}"),
        ("b", f"http://127.0.0.1:5001/#/experiments/{ids['b']}/runs?{query}"),
    ]  # by name; "empty" and MLflow's "Default" hold no runs
    for name, has_view in (("a", True), ("b", True), ("empty", False)):
        assert (VIEW_TAG in client.get_experiment(ids[name]).tags) == has_view  # written


def test_the_ui_of_a_server_is_the_server() -> None:
    assert ui_url("https://mlflow.example.org/") == "https://mlflow.example.org"
    assert ui_url("sqlite:////x/mlflow.db?timeout=60", "127.0.0.1", 5001) == "http://127.0.0.1:5001"
    cmd = ui_command("sqlite:////x/mlflow.db", "127.0.0.1", 5001)
    assert cmd[:4] == [sys.executable, "-m", "mlflow", "ui"]
    args = "--backend-store-uri sqlite:////x/mlflow.db --host 127.0.0.1 --port 5001 --workers 1"
    assert cmd[4:] == ["--app-name", "fedcomm", *args.split()]
    assert app_installed()  # this checkout's entry point (`pip install -e .`)
    # an install that predates the app: MLflow's own (and `fedcomm ui` says so)
    assert ui_command("sqlite:////x/mlflow.db", "127.0.0.1", 5001, app=False)[4:] == args.split()


def test_ui_without_a_store_is_one_error_line(project: Path) -> None:
    res = CliRunner().invoke(app, ["ui"])
    out = res.output.strip()
    assert res.exit_code == 2, out
    assert out.startswith(f"error: {project / 'mlflow.db'}: no MLflow store (no such file)"), out
    assert "\n" not in out
    assert not (project / "mlflow.db").exists()  # nothing created in its place
