"""The experiment's summary in MLflow: the summarize stage's outputs on a run of their own.

Each summarize logs one run named ``summary`` (``summary (<DVC experiment>)`` inside one; tag
``fedcomm.kind: summary``, so ``fedcomm report`` and the sweeps never take it for a training run)
into the training runs' experiment, with ``reports/interactive.html`` (accuracy against GiB,
round and simulated hours, mean ± SE over seeds), ``summary.md``, ``summary.json``, the PNG
plots (shown inline by MLflow's artifact view), and per run label its headline numbers over seeds
as metrics (``<run>/final_acc``, ``<run>/up_gib``, ``<run>/down_gib``: means over seeds). The
run's description says where each is. MLflow 3.17 previews an HTML artifact in an iframe
sandboxed to scripts alone (an opaque origin, from a blob URL): a small page renders there, but
with the page's 0.9 MB inline Vega bundle nothing paints (checked in headless Chromium: the same
page without the bundle paints, and the same iframe with ``allow-same-origin`` paints all of it),
so the page is to be downloaded (the artifact view's download icon) and opened in a browser,
where it works offline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from fedcomm.errors import stopping
from fedcomm.tracking.mlflow import DVC_EXP_TAG, dvc_exp_name, open_run
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
    """Log the experiment's summary run (module docstring); returns its run id. Ctrl-C while
    logging marks the run ``KILLED`` (as a training run's), an error ``FAILED``; either goes on.

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
        f"**{title}**: the summarize stage's report over every run and seed. *Artifacts* → "
        "`plots/` shows accuracy against GiB and against round (mean ± standard error over "
        f"seeds); `{page.name}` is the interactive page (download it with the artifact view's "
        "icon and open it in a browser: it works offline; MLflow's own preview does not run "
        "it); `summary.md` has the tables."
    )
    tags = {
        KIND_TAG: KIND,
        DVC_EXP_TAG: dvc_exp_name(),
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
    except KeyboardInterrupt:  # Ctrl-C: KILLED, as a training run's
        stopping()
        tracker.finish("KILLED")
        raise
    except BaseException:
        tracker.finish("FAILED")
        raise
    tracker.finish()
    return tracker.run_id
