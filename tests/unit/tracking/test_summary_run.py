"""The summarize stage's MLflow run ends as a training run does: ``FINISHED``, ``KILLED`` on
Ctrl-C (the KeyboardInterrupt goes on), ``FAILED`` on an error."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient

from fedcomm.tracking import mlflow as tracking
from fedcomm.tracking.summary_run import log_summary_run


def _log(root: Path) -> str:
    page = root / "interactive.html"
    page.write_text("<html></html>")
    return log_summary_run(
        uri=None,
        experiment="tests",
        title="t",
        page=page,
        files=[],
        plots=[],
        metrics={"fedavg/final_acc": 0.5},
    )


def _statuses(root: Path) -> list[str]:
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tests")
    assert exp is not None
    return [r.info.status for r in client.search_runs([exp.experiment_id])]


@pytest.mark.parametrize(
    ("raised", "status"), [(KeyboardInterrupt, "KILLED"), (RuntimeError, "FAILED")]
)
def test_an_interrupted_or_failed_summary_run_is_marked_so(
    store: Path, monkeypatch: pytest.MonkeyPatch, raised: type[BaseException], status: str
) -> None:
    def stop(self: tracking.MlflowTracker, metrics: object) -> None:
        raise raised

    monkeypatch.setattr(tracking.MlflowTracker, "log_metrics", stop)
    with pytest.raises(raised):
        _log(store)
    assert _statuses(store) == [status]


def test_a_summary_run_finishes_tagged_with_its_dvc_experiment(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DVC_EXP_NAME", "exp-1")
    run_id = _log(store)
    assert _statuses(store) == ["FINISHED"]
    run = MlflowClient(f"sqlite:///{store / 'mlflow.db'}").get_run(run_id)
    assert run.data.tags[tracking.DVC_EXP_TAG] == "exp-1" == tracking.dvc_exp_name()
