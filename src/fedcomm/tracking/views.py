"""What MLflow 3.17's UI draws for fedcomm: accuracy against traffic, on the run page and in the
saved view "fedcomm: accuracy vs traffic" of every fedcomm experiment.

The run page ("Model metrics") draws one chart per metric against the metric's step, in sections
named by the key's part before its last ``/`` and sorted by name (unprefixed keys last); its
x-axis and layout are kept per browser and run, out of the API's reach. So each round's
accuracies are logged a second time at a traffic step (:func:`traffic_series`):
``accuracy_vs_KiB/global`` (``local``, ``topk``) at step = the cumulative traffic in KiB, and
``accuracy_vs_sim_s/...`` at step = simulated seconds with a ``train.system`` section (and
``accuracy_vs_energy_J/...`` at step = the clients' joules so far with its ``energy``); their
sections sort before ``comm``, ``global``, ... and come first. (Its *Configure charts* menu can
also put every chart on the x-axis metric ``comm/cum_gib``.)

The experiment page keeps *saved views* as experiment tags ``mlflow.sharedViewState.<id>``: a JSON
envelope ``{"name", "createdAt", "updatedAt", "state"}`` whose ``state`` is a JSON string of the
page's search facets and UI state (the runs table's columns and their order, the charts and
their sections, each chart's x-axis, ...; what it leaves out takes the page's defaults). The page
opens one with the URL parameter ``viewStateShareKey=<id>`` and lists them under *Views*, so the
view is written from the API (:func:`ensure_view`) and linked to (:func:`view_page`). It shows:

- the runs table with the columns that matter here, after the run's name and start: the
  ``algorithm`` tag, the evaluate stage's headline metrics ``final_acc``, ``final_local_acc``,
  ``up_gib``, ``down_gib``, ``save_x``, the DVC experiment (tag ``dvc.exp_name``) and the
  partition (Dataset);
- its charts (the button beside the table's, ``compareRunsMode=CHART``), first a section
  ``accuracy vs traffic``: global, local and top-k accuracy against ``comm/cum_gib`` (x-axis
  *Metric*: MLflow pairs the two series by step, the round) and ``accuracy_vs_sim_s/global``
  (hidden where no run has it), then MLflow's own sections (``comm``, ``train``, ...).

MLflow draws a chart from at most 320 points of each series (evenly sampled rows): beyond 320
rounds with ``train.eval_every`` above 1, accuracy and traffic samples share fewer rounds and the
line has fewer points, never wrong ones; the ``accuracy_vs_KiB`` series has no such limit.

A view someone changed and saved again in the UI (which drops the envelope's ``fedcomm`` field)
is kept; one this module wrote is rewritten when its state changes (a newer fedcomm).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from fedcomm.errors import interrupts_deferred

TRAFFIC_SECTION = "accuracy_vs_KiB"  # accuracy at step = cumulative KiB (up + down)
SIM_SECTION = "accuracy_vs_sim_s"  # accuracy at step = simulated seconds (train.system)
ENERGY_SECTION = "accuracy_vs_energy_J"  # accuracy at step = the clients' joules (system.energy)
ACCURACIES = {"global/accuracy": "global", "local/accuracy": "local", "topk/accuracy": "topk"}

VIEW_ID = "fedcomm-accuracy-vs-traffic"
VIEW_NAME = "fedcomm: accuracy vs traffic"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_ID}"
MAX_TAG_VALUE = 20_000  # MLflow's MAX_EXPERIMENT_TAG_VAL_LENGTH (mlflow/utils/validation.py)
SECTION = "accuracy vs traffic"
TRAFFIC_AXIS = "comm/cum_gib"  # x-axis "Metric": MLflow pairs it with the accuracy by step
STEP = ""  # x-axis "Step"
# (y metric, x metric or STEP, chart title): the section's charts, in order
CHARTS = (
    ("global/accuracy", TRAFFIC_AXIS, "global accuracy vs GiB (up + down)"),
    ("local/accuracy", TRAFFIC_AXIS, "local accuracy vs GiB (up + down)"),
    ("topk/accuracy", TRAFFIC_AXIS, "top-k accuracy vs GiB (up + down)"),
    (f"{SIM_SECTION}/global", STEP, "global accuracy vs simulated seconds"),
)
COLUMNS_PER_ROW = 2  # the section's charts per row (MLflow's default: 3)
# the runs table's columns, in this order after the run's name and start (pinned to the left);
# ids: MLflow's makeCanonicalSortKey, <type>.`<name>`; the table's other columns come after them
COLUMNS = (
    "tags.`algorithm`",
    "metrics.`final_acc`",
    "metrics.`final_local_acc`",
    "metrics.`up_gib`",
    "metrics.`down_gib`",
    "metrics.`save_x`",
    "tags.`dvc.exp_name`",
    "attributes.`Dataset`",
)
_SECTION_ID = "fedcomm-accuracy-vs-traffic"


def traffic_series(metrics: Mapping[str, float | None]) -> list[tuple[str, float, int]]:
    """``(key, value, step)`` of a round's accuracies (``global``, ``local``, ``topk``) logged a
    second time with a traffic step: ``accuracy_vs_KiB/<name>`` at step = the run's cumulative
    traffic so far (``comm/cum_bytes``, up + down) in KiB, and, with a ``train.system`` section,
    ``accuracy_vs_sim_s/<name>`` at step = its simulated seconds (``time/sim_elapsed_s``) and,
    with its ``energy``, ``accuracy_vs_energy_J/<name>`` at step = its clients' joules so far
    (``energy/cum_j``).

    MLflow's charts draw a metric against its step by default (the run page's only default), so
    these draw accuracy against traffic where ``global/accuracy`` draws it against rounds; MLflow
    steps are integers, hence KiB, whole seconds and whole joules. The sections' names sort
    before every other (``comm``, ``global``, an algorithm's ...): they are the run page's first
    charts."""
    out: list[tuple[str, float, int]] = []
    for section, axis in (
        (TRAFFIC_SECTION, "comm/cum_bytes"),
        (SIM_SECTION, "time/sim_elapsed_s"),
        (ENERGY_SECTION, "energy/cum_j"),
    ):
        x = metrics.get(axis)
        if x is None or not math.isfinite(float(x)):
            continue
        step = round(float(x) / 1024) if axis == "comm/cum_bytes" else round(float(x))
        for key, name in ACCURACIES.items():
            v = metrics.get(key)
            if v is not None and math.isfinite(float(v)):
                out.append((f"{section}/{name}", float(v), step))
    return out


def _line_chart(index: int, metric: str, x_metric: str, title: str) -> dict[str, Any]:
    """A line chart card of MLflow's compare view (``RunsChartsLineCardConfig``) drawing
    ``metric`` against ``x_metric`` (:data:`STEP`: its step), its own x-axis whatever the page's
    global one."""
    return {
        "uuid": f"fedcomm-chart-{index}",
        "type": "LINE",
        "runsCountToCompare": 10,
        "metricSectionId": _SECTION_ID,
        "deleted": False,
        "isGenerated": False,
        "displayName": title,
        "metricKey": metric,
        "selectedMetricKeys": [metric],
        "lineSmoothness": 0,
        "xAxisScaleType": "linear",
        "scaleType": "linear",
        "range": {},  # no bounds (the card's undefined xMin ... yMax)
        "xAxisKey": "metric" if x_metric else "step",
        "selectedXAxisMetricKey": x_metric,
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": False,
        "useGlobalLineSmoothing": True,
    }


def view_state() -> dict[str, Any]:
    """The view's state: MLflow's UI state keys it sets (the rest take the page's defaults)."""
    return {
        "selectedColumns": list(COLUMNS),
        "columnOrder": list(COLUMNS),
        "compareRunSections": [
            {
                "uuid": _SECTION_ID,
                "name": SECTION,
                "display": True,
                "isReordered": False,
                "deleted": False,
                "isGenerated": False,
                "columns": COLUMNS_PER_ROW,
            }
        ],
        "compareRunCharts": [_line_chart(i, *chart) for i, chart in enumerate(CHARTS)],
        # sections keep this order; MLflow appends its own ones (comm, global, ...) after it
        "isAccordionReordered": True,
        "hideEmptyCharts": True,
    }


def view_tag_value(now_ms: int | None = None, created_ms: int | None = None) -> str:
    """The experiment tag's value: MLflow's saved-view envelope, marked as fedcomm's."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    envelope = {
        "name": VIEW_NAME,
        "createdAt": now if created_ms is None else created_ms,
        "updatedAt": now,
        "state": json.dumps(view_state(), separators=(",", ":")),
        "fedcomm": 1,  # written by fedcomm (the UI drops it when someone saves the view)
    }
    value = json.dumps(envelope, separators=(",", ":"))
    if len(value) > MAX_TAG_VALUE:  # pragma: no cover - a programming error, caught by tests
        raise ValueError(f"saved view: {len(value)} characters, MLflow keeps {MAX_TAG_VALUE}")
    return value


def _ours_and_stale(value: str) -> bool:
    """Whether tag ``value`` is a view fedcomm wrote whose state differs from today's."""
    try:
        envelope = json.loads(value)
        ours = isinstance(envelope, dict) and "fedcomm" in envelope
        return ours and json.loads(envelope["state"]) != view_state()
    except (ValueError, KeyError, TypeError):
        return False  # not ours to replace


def ensure_view(
    client: MlflowClient, experiment_id: str, tags: Mapping[str, str] | None = None
) -> bool:
    """Write the saved view into experiment ``experiment_id`` unless it holds it already (or a
    version someone saved in the UI). ``tags``: its tags, if fetched. Whether it was written."""
    if tags is None:
        tags = client.get_experiment(experiment_id).tags
    old = tags.get(VIEW_TAG)
    if old is not None and not _ours_and_stale(old):
        return False
    created = None
    if old is not None:
        created = json.loads(old).get("createdAt")
    try:
        with interrupts_deferred():  # a write cut short leaves the SQLite store locked
            client.set_experiment_tag(experiment_id, VIEW_TAG, view_tag_value(created_ms=created))
    except MlflowException:
        # two processes writing it at once (two sweep workers opening the experiment): on a
        # SQL store the second insert of the tag's key fails; the first one's view stands
        if old is None and VIEW_TAG in client.get_experiment(experiment_id).tags:
            return False
        raise
    return True


def view_page(ui_url: str, experiment_id: str, *, charts: bool = False) -> str:
    """The MLflow UI's experiment page opening the saved view, in the model-training layout, on
    its runs table; ``charts``: on its charts (``compareRunsMode=CHART``, the address the chart
    button beside the table's opens)."""
    query = {"workflowType": "machine_learning", "viewStateShareKey": VIEW_ID}
    if charts:
        query["compareRunsMode"] = "CHART"
    return f"{ui_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query)}"
