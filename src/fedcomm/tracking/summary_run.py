"""The experiment's summary in MLflow: the summarize stage's outputs on a run of their own.

Each summarize logs one run named ``summary`` (``summary (<DVC experiment>)`` inside one; tag
``fedcomm.kind: summary``, so ``fedcomm report`` and the sweeps never take it for a training run)
into the training runs' experiment, with ``reports/interactive.html`` (accuracy against GiB,
round and simulated hours, mean ± SE over seeds; MLflow's artifact view runs its inline Vega),
``summary.md``, ``summary.json``, the PNG plots, and per run label its headline numbers over seeds
as metrics (``<run>/final_acc``, ``<run>/up_gib``, ``<run>/down_gib``: means over seeds). The
run's description points at the page: one click from the runs table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from fedcomm.tracking.mlflow import DVC_EXP_TAG, open_run
from fedcomm.tracking.query import KIND_TAG

KIND = "summary"  # its KIND_TAG
NOTE_TAG = "mlflow.note.content"  # the run's description, shown on its overview


def log_summary_run(
    *,
    uri: str | None,
    experiment: str,
    title: str,
    page: Path,
    files: Sequence[Path],
    plots: Sequence[Path],
    metrics: Mapping[str, float],
) -> str:
    """Log the experiment's summary run (module docstring); returns its run id.

    Args:
        uri: the tracking URI (``tracking.uri``; None: the project's store).
        experiment: the MLflow experiment of the training runs.
        title: ``summarize.title``.
        page: ``reports/interactive.html``.
        files: the other report files logged at the artifacts' top level.
        plots: PNGs, logged under ``plots/``.
        metrics: ``<run>/<headline key>`` -> value (means over seeds).
    """
    note = (
        f"**{title}**: the summarize stage's report over every run and seed. Open "
        f"*Artifacts* → `{page.name}` for accuracy against GiB, round and simulated hours "
        "(mean ± standard error over seeds, interactive), `summary.md` for the tables."
    )
    tags = {
        KIND_TAG: KIND,
        DVC_EXP_TAG: os.environ.get("DVC_EXP_NAME", ""),
        NOTE_TAG: note,
    }
    tracker = open_run(
        uri=uri, experiment=experiment, run_name="summary", tags=tags, params={"title": title}
    )
    try:
        tracker.log_artifact(page)
        for path in files:
            tracker.log_artifact(path)
        for png in plots:
            tracker.log_artifact(png, "plots")
        tracker.log_metrics(metrics)
    except BaseException:
        tracker.finish("FAILED")
        raise
    tracker.finish()
    return tracker.run_id
