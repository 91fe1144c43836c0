"""What fedcomm gives MLflow's UI to draw, without a browser (``test_mlflow_ui.py`` opens it):
accuracy logged again at a traffic step, the saved view "fedcomm: accuracy vs traffic" as an
experiment tag MLflow's experiment page reads, run names that carry the DVC experiment, and the
``mlflow.app`` plugin whose page defaults a new browser to the model-training layout."""

from __future__ import annotations

import json
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from fedcomm.tracking import mlflow as tracking
from fedcomm.tracking import ui_app, views

# MLflow 3.17's experiment page UI state keys (module 1395 of its UI bundle) and search facets
UI_STATE_KEYS = {
    "selectedColumns",
    "columnOrder",
    "columnWidths",
    "runsExpanded",
    "runsPinned",
    "runsHidden",
    "runsVisibilityMap",
    "runsHiddenMode",
    "compareRunCharts",
    "compareRunSections",
    "viewMaximized",
    "runListHidden",
    "isAccordionReordered",
    "groupBy",
    "groupsExpanded",
    "autoRefreshEnabled",
    "useGroupedValuesInCharts",
    "hideEmptyCharts",
    "globalLineChartConfig",
    "chartsSearchFilter",
}


def _client(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def test_accuracy_is_logged_again_against_kib_and_simulated_seconds() -> None:
    metrics = {
        "comm/cum_bytes": 3 * 1024 * 1024 + 700.0,  # 3 MiB + 700 B: 3072.68 KiB
        "global/accuracy": 0.5,
        "local/accuracy": float("nan"),
        "topk/accuracy": None,
        "train/loss": 1.0,
    }
    assert views.traffic_series(metrics) == [("accuracy_vs_KiB/global", 0.5, 3073)]
    timed = {**metrics, "time/sim_elapsed_s": 61.4, "local/accuracy": 0.75}
    assert views.traffic_series(timed) == [
        ("accuracy_vs_KiB/global", 0.5, 3073),
        ("accuracy_vs_KiB/local", 0.75, 3073),
        ("accuracy_vs_sim_s/global", 0.5, 61),
        ("accuracy_vs_sim_s/local", 0.75, 61),
    ]
    assert views.traffic_series({"comm/cum_bytes": 1e6, "train/loss": 1.0}) == []  # no eval
    # their sections sort before every other one (MLflow sorts sections by name)
    assert sorted([views.TRAFFIC_SECTION, views.SIM_SECTION, "afd", "comm", "global"])[:2] == [
        views.TRAFFIC_SECTION,
        views.SIM_SECTION,
    ]


def test_log_round_writes_the_traffic_series(store: Path) -> None:
    tracker = tracking.open_run(
        uri=None, experiment="tests", run_name="fedavg-s0", tags={}, params={}
    )
    for round_, acc in ((1, 0.25), (2, 0.5)):
        cum = round_ * 2048.0
        tracker.log_round(round_, {"comm/cum_bytes": cum, "global/accuracy": acc})
    client = _client(store)
    history = client.get_metric_history(tracker.run_id, "accuracy_vs_KiB/global")
    assert [(m.step, m.value) for m in history] == [(2, 0.25), (4, 0.5)]
    by_round = client.get_metric_history(tracker.run_id, "global/accuracy")
    assert [(m.step, m.value) for m in by_round] == [(1, 0.25), (2, 0.5)]


def test_the_saved_view_is_an_envelope_mlflow_reads() -> None:
    value = views.view_tag_value(now_ms=1000)
    assert len(value) < views.MAX_TAG_VALUE  # MLflow's limit on an experiment tag's value
    envelope = json.loads(value)
    assert envelope["name"] == "fedcomm: accuracy vs traffic"
    assert envelope["createdAt"] == envelope["updatedAt"] == 1000
    state = json.loads(envelope["state"])
    assert set(state) <= UI_STATE_KEYS
    assert state["selectedColumns"][:4] == [
        "tags.`algorithm`",
        "metrics.`final_acc`",
        "metrics.`final_local_acc`",
        "metrics.`up_gib`",
    ]
    (section,) = state["compareRunSections"]
    first = state["compareRunCharts"][0]
    assert first["metricSectionId"] == section["uuid"] and section["name"] == "accuracy vs traffic"
    assert (first["type"], first["metricKey"], first["xAxisKey"]) == (
        "LINE",
        "global/accuracy",
        "metric",
    )
    assert first["selectedXAxisMetricKey"] == "comm/cum_gib" and not first["useGlobalXaxisKey"]
    assert state["isAccordionReordered"]  # the section stays first
    assert views.VIEW_TAG == "mlflow.sharedViewState.fedcomm-accuracy-vs-traffic"


def test_the_view_page_opens_the_view_in_model_training() -> None:
    base = "http://127.0.0.1:5000/"
    query = "workflowType=machine_learning&viewStateShareKey=fedcomm-accuracy-vs-traffic"
    assert views.view_page(base, "7") == f"http://127.0.0.1:5000/#/experiments/7/runs?{query}"
    assert views.view_page(base, "7", charts=True).endswith(f"{query}&compareRunsMode=CHART")


def test_a_view_is_written_once_kept_when_someone_saved_it_and_renewed_when_stale(
    store: Path,
) -> None:
    client = _client(store)
    exp_id = client.create_experiment("x")
    assert views.ensure_view(client, exp_id)
    first = client.get_experiment(exp_id).tags[views.VIEW_TAG]
    assert not views.ensure_view(client, exp_id)  # once
    # fedcomm's own view of another state (an older fedcomm): renewed, created time kept
    old = json.loads(first)
    client.set_experiment_tag(exp_id, views.VIEW_TAG, json.dumps({**old, "state": "{}"}))
    assert views.ensure_view(client, exp_id)
    renewed = json.loads(client.get_experiment(exp_id).tags[views.VIEW_TAG])
    assert renewed["createdAt"] == old["createdAt"]
    assert json.loads(renewed["state"]) == views.view_state()
    # saved again from the UI (its envelope has no "fedcomm" field): someone's choice, kept
    mine = json.dumps({k: v for k, v in renewed.items() if k != "fedcomm"} | {"state": "{}"})
    client.set_experiment_tag(exp_id, views.VIEW_TAG, mine)
    assert not views.ensure_view(client, exp_id)
    assert client.get_experiment(exp_id).tags[views.VIEW_TAG] == mine


class _Racing(MlflowClient):
    """A client that loses the race to write the view: another process writes the tag first
    (``other``: its value, or None for a failure with nothing written), then this write fails
    as a SQL store's duplicate key does."""

    def __init__(self, uri: str, other: str | None) -> None:
        super().__init__(uri)
        self.other = other

    def set_experiment_tag(self, experiment_id: str, key: str, value: Any) -> None:
        if self.other is not None:
            super().set_experiment_tag(experiment_id, key, self.other)
        raise MlflowException("duplicate key value violates unique constraint")


def test_a_view_written_by_another_process_at_the_same_moment_stands(store: Path) -> None:
    exp_id = _client(store).create_experiment("x")
    theirs = views.view_tag_value()
    assert not views.ensure_view(_Racing(f"sqlite:///{store / 'mlflow.db'}", theirs), exp_id)
    assert _client(store).get_experiment(exp_id).tags[views.VIEW_TAG] == theirs
    exp_id = _client(store).create_experiment("y")  # a failure with no view written: raised
    with pytest.raises(MlflowException):
        views.ensure_view(_Racing(f"sqlite:///{store / 'mlflow.db'}", None), exp_id)


def test_new_experiments_get_the_view_and_runs_name_their_dvc_experiment(store: Path) -> None:
    tags = {"dvc.exp_name": "lr-0.3", "run": "fedavg"}
    tracker = tracking.open_run(
        uri=None, experiment="new", run_name="fedavg-s0", tags=tags, params={}
    )
    client = _client(store)
    run = client.get_run(tracker.run_id)
    assert run.info.run_name == "fedavg-s0 (lr-0.3)"
    exp = client.get_experiment(run.info.experiment_id)
    assert views.VIEW_TAG in exp.tags and exp.tags[tracking.KIND_TAG] == tracking.MODEL_TRAINING
    assert tracking.run_title("fedavg-s0", {"dvc.exp_name": ""}) == "fedavg-s0"  # a workspace run
    assert tracking.run_title("trial-3-s0", {}) == "trial-3-s0"


def test_the_ui_app_defaults_a_new_browser_to_model_training(tmp_path: Path) -> None:
    (found,) = entry_points(group="mlflow.app", name="fedcomm")  # `pip install -e .` registers it
    assert found.value == "fedcomm.tracking.ui_app:create_app"
    html = "<!doctype html><html><head><title>MLflow</title></head><body></body></html>"
    (tmp_path / "index.html").write_text(html)
    app = Flask("mlflow-like", static_folder=str(tmp_path))
    app.add_url_rule("/", "serve", lambda: "MLflow's own page")
    served = ui_app.create_app(app)  # no uvicorn in this process: the Flask app itself
    assert served is app
    page = app.test_client().get("/").get_data(as_text=True)
    assert page.startswith("<!doctype html><html><head><script>")
    assert '"mlflow.workflowType_v1": "\\"machine_learning\\""' in page
    assert "localStorage.getItem(k)===null" in page  # a choice made in the UI is kept
    assert page.endswith("<title>MLflow</title></head><body></body></html>")
    (tmp_path / "index.html").unlink()  # a source install of MLflow: its own message
    assert app.test_client().get("/").get_data(as_text=True) == "MLflow's own page"


def test_under_uvicorn_the_app_is_mlflows_fastapi_wrapper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("_MLFLOW_SGI_NAME", "uvicorn")  # set by `mlflow ui` for its workers
    app = Flask("mlflow-like", static_folder=str(tmp_path))
    app.add_url_rule("/", "serve", lambda: "")
    assert type(ui_app.create_app(app)).__name__ == "FastAPI"
