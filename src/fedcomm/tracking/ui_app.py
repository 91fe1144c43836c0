"""``mlflow ui --app-name fedcomm``: MLflow's own server, whose UI opens on model training.

MLflow 3.17's UI lays every page out (side bar, run page tabs, breadcrumbs) for one of two
workflows, GenAI or model training, and reads which from one place only: the URL parameter
``workflowType`` (``genai`` / ``machine_learning``) where a link carries it, else the browser's
``localStorage`` key ``mlflow.workflowType_v1`` (a JSON string), written by its GenAI / Model
training switch and ``"genai"`` while unset. The experiment tag ``mlflow.experimentKind`` is not
read (a feature flag of the 3.17 bundle, always on, derives the kind from the workflow instead),
and the links inside the UI drop ``workflowType``: in a new browser, a run opened from the
model-training runs table opens in the GenAI layout (Evaluations, Traces, Judges), and ``mlflow
ui`` opens on the GenAI welcome page. Nothing on the server decides it.

This app is MLflow's documented server plugin mechanism (entry point group ``mlflow.app``, as
its ``basic-auth`` app; ``mlflow ui`` and ``mlflow server`` take ``--app-name``): MLflow's Flask
app and FastAPI wrapper unchanged, except the page every UI address serves (``index.html``),
which first sets that ``localStorage`` key to ``"machine_learning"`` where it is unset, and the
assistant panel's "opened on the first load" key (an LLM assistant an offline project cannot
use, which would take a quarter of a new browser's first page; its button stays). A choice made
in the UI is kept: only unset keys are written. ``fedcomm ui`` starts ``mlflow ui`` with
``--app-name fedcomm`` (pyproject's ``[project.entry-points."mlflow.app"]``: a checkout installed
before needs ``pip install -e .`` again to register it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flask import Flask, Response
from mlflow.server import app as mlflow_app

# the UI's localStorage keys (its useLocalStorage(key, version): "<key>_v<version>", JSON values)
# and the defaults set where they are unset: the model-training layout, and the assistant panel
# (it needs an LLM provider, which an offline project lacks) not opening itself on the first page
DEFAULTS = {
    "mlflow.workflowType_v1": "machine_learning",
    "mlflow.assistant.fab.autoOpenedOnFirstLoad_v1": True,
}
# runs before MLflow's own scripts (deferred), so the UI reads the defaults on its first render
DEFAULT_SCRIPT = (
    "<script>try{var d="
    + json.dumps({k: json.dumps(v) for k, v in DEFAULTS.items()})
    + ";for(var k in d){if(localStorage.getItem(k)===null)localStorage.setItem(k,d[k])}}"
    "catch(e){}</script>"
)


def index_html(static_folder: str | Path) -> str | None:
    """MLflow's ``index.html`` with :data:`DEFAULT_SCRIPT` first in its ``<head>``; ``None``
    where the UI is not built (a source install of MLflow)."""
    page = Path(static_folder) / "index.html"
    if not page.is_file():
        return None
    html = page.read_text(encoding="utf-8")
    head = html.find("<head>")
    at = head + len("<head>") if head >= 0 else 0
    return html[:at] + DEFAULT_SCRIPT + html[at:]


def create_app(app: Flask = mlflow_app) -> Any:
    """MLflow's app with :func:`index_html` as its UI page (the Flask endpoint ``serve``); under
    uvicorn (``mlflow ui``'s default) wrapped in MLflow's FastAPI app, as ``basic-auth`` does."""
    from mlflow.environment_variables import _MLFLOW_SGI_NAME

    original = app.view_functions["serve"]
    static_folder = app.static_folder or ""

    def serve() -> Any:
        html = index_html(static_folder)
        if html is None:
            return original()  # MLflow's own message on a missing UI
        return Response(html, mimetype="text/html", headers={"Cache-Control": "no-cache"})

    app.view_functions["serve"] = serve
    if _MLFLOW_SGI_NAME.get() == "uvicorn":
        from mlflow.server.fastapi_app import create_fastapi_app

        return create_fastapi_app(app)
    return app
