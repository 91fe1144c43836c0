"""The real pipeline: `dvc repro` on the tiny profile in a temporary git+DVC copy of the repo,
then a queued experiment (`dvc exp run --queue` + `dvc queue start`) that must log into the same
absolute MLflow store as the workspace."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest
import yaml
from mlflow import MlflowClient

from fedcomm.config import load_params
from fedcomm.evaluation.headline import HEADLINE_KEYS
from tests.conftest import REPO
from tests.pipeline._repo import build_repo, commit, sh, shell_env

pytestmark = pytest.mark.slow

_sh = sh


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny = (REPO / "pipeline" / "profiles" / "tiny.yaml").read_text()
    return build_repo(tmp_path_factory.mktemp("pipeline"), tiny)


def _runs(root: Path) -> list[tuple[str, str, str]]:
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    assert exp is not None
    return sorted(
        (r.info.run_name or "", r.info.status, r.data.tags.get("dvc.exp_name", ""))
        for r in client.search_runs([exp.experiment_id])
    )


def test_repro_writes_reports_metrics_and_mlflow_runs(repo: Path) -> None:
    params = load_params(repo / "params.yaml")
    summary = (repo / "reports" / "summary.md").read_text()
    for run in params.experiment.runs:
        assert f"`{run}`" in summary
    assert "## Best global accuracy (%) within a communication budget" in summary
    assert "## Reaching a target global accuracy" in summary
    assert "## Upload per client per round" in summary
    for png in ("global_accuracy_vs_gib", "local_accuracy_vs_gib", "accuracy_vs_round"):
        assert (repo / "reports" / "plots" / f"{png}.png").read_bytes()[:4] == b"\x89PNG"
    over_seeds = json.loads((repo / "reports" / "summary.json").read_text())
    assert set(over_seeds) == set(params.experiment.runs)
    assert not (repo / "reports" / "metrics.json").exists()  # not a DVC metric any more
    run_summary = json.loads((repo / "runs" / "fedavg-s0" / "summary.json").read_text())
    rounds = pl.read_parquet(repo / "runs" / "fedavg-s0" / "train" / "rounds.parquet")
    evaluated = rounds.sort("round")["global/accuracy"].drop_nulls()
    k = params.evaluate.last_k
    final = run_summary["final"]["global/accuracy"]
    assert final == pytest.approx(float(evaluated.tail(k).mean()))  # type: ignore[arg-type]
    assert 0.0 < final <= 1.0
    # the saved model is the last round's
    assert run_summary["saved_model"]["global/accuracy"] == pytest.approx(evaluated[-1])
    # mlp 64-16-10: 1,210 fp32 parameters per dense upload
    assert run_summary["upload"]["bytes_per_client_round"] == 1210 * 4
    headline = json.loads((repo / "runs" / "fedavg-s0" / "metrics.json").read_text())
    targets = [f"gib_to_{t:g}" for t in params.evaluate.targets]
    assert sorted(headline) == sorted([*HEADLINE_KEYS, *targets])
    assert headline["final_acc"] == final
    assert headline["up_gib"] == run_summary["final"]["comm/up_gib"]
    assert headline["save_x"] == pytest.approx(1 / run_summary["comm"]["cost_vs_dense_e2e"])
    # one MLflow run per (algorithm, seed), finished, with the per-round curves and artifacts
    assert _runs(repo) == [
        ("fedadam-s0", "FINISHED", ""),
        ("fedavg-s0", "FINISHED", ""),
        ("fedsparse-s0", "FINISHED", ""),
        ("summary", "FINISHED", ""),  # the summarize stage's report (below)
    ]
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tiny")
    assert exp is not None
    run = client.search_runs([exp.experiment_id], "attributes.run_name = 'fedavg-s0'")[0]
    assert len(client.get_metric_history(run.info.run_id, "global/accuracy")) == params.train.rounds
    assert run.data.tags["partition_hash"] and run.data.tags["algorithm"] == "fedavg"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    expected = {"ledger.parquet", "clients.parquet", "model.safetensors", "config.json", "plots"}
    assert expected <= artifacts
    plots = {a.path for a in client.list_artifacts(run.info.run_id, "plots")}
    assert "plots/global_accuracy_vs_gib.png" in plots
    # the experiment's summary run: the interactive page, the tables, the means over seeds
    (summary_run,) = client.search_runs([exp.experiment_id], "tags.`fedcomm.kind` = 'summary'")
    shown = {a.path for a in client.list_artifacts(summary_run.info.run_id)}
    assert {"interactive.html", "summary.md", "summary.json", "plots"} <= shown
    assert "interactive.html" in summary_run.data.tags["mlflow.note.content"]
    assert {"plots/global_accuracy_vs_gib.png"} <= {
        a.path for a in client.list_artifacts(summary_run.info.run_id, "plots")
    }
    assert summary_run.data.metrics["fedavg/final_acc"] == pytest.approx(
        over_seeds["fedavg"]["final"]["global/accuracy"]
    )


def test_dvc_reports_metrics_and_plots(repo: Path) -> None:
    shown = json.loads(_sh(repo, "dvc", "metrics", "show", "--json"))
    assert shown  # parsed by DVC
    # the runs' headline numbers, one row each, readable in a terminal of 200 columns
    table = _sh(repo, "dvc", "metrics", "show")
    params = load_params(repo / "params.yaml")
    rows = [line for line in table.splitlines() if "/metrics.json" in line]
    assert len(rows) == len(params.experiment.runs) * len(params.experiment.seeds)
    assert "final_acc" in table and "summary.json" not in table
    assert max(len(line) for line in table.splitlines()) <= 200, table
    out = _sh(repo, "dvc", "plots", "show", "-o", "dvc_plots")
    assert "index.html" in out and (repo / "dvc_plots" / "index.html").is_file()
    # the default pipeline (`dvc status` alone also lists the opt-in sweep stages, never run)
    assert "Data and pipelines are up to date" in _sh(repo, "dvc", "status", "dvc.yaml")


def test_partition_is_refused_when_stale(repo: Path) -> None:
    from fedcomm.config import validate_params
    from fedcomm.data.partition_files import StalePartitionError
    from fedcomm.stages.partition import load_federated
    from fedcomm.stages.paths import Paths

    raw = yaml.safe_load((repo / "params.yaml").read_text())
    raw["partition"]["alpha"] = 0.3
    with pytest.raises(StalePartitionError, match="dvc repro partition"):
        load_federated(validate_params(raw), Paths(partition=repo / "data" / "partition"))


def test_queued_experiment_logs_to_the_workspace_store(repo: Path) -> None:
    commit(repo, "repro")
    # one run is enough to show where the queued copy logs (2 stage processes of training, not 6)
    queue = ["-S", "train.rounds=2", "-S", "experiment.runs=[fedavg]", "-n", "queued-exp"]
    _sh(repo, "dvc", "exp", "run", "--queue", *queue)
    _sh(repo, "dvc", "queue", "start", "-j", "1")
    # wait for the queued pipeline's last MLflow run (read in this process: a `dvc queue status`
    # is a new process, ~1 s of CPU taken from the experiment), asking DVC every 20 s meanwhile
    # (a failed task) and every 2 s once that run is done (DVC still records the experiment)
    deadline, asked = time.time() + 300, 0.0
    while time.time() < deadline:
        done = ("summary (queued-exp)", "FINISHED", "queued-exp") in _runs(repo)
        if done or time.time() - asked > 20:
            status, asked = _sh(repo, "dvc", "queue", "status"), time.time()
            if "queued-exp" in status and not any(s in status for s in ("Queued", "Running")):
                break
        time.sleep(2)
    assert "Success" in _sh(repo, "dvc", "queue", "status")
    names = [r for r in _runs(repo) if r[2] == "queued-exp"]
    assert [(n, s) for n, s, _ in names] == [  # named after the DVC experiment
        ("fedavg-s0 (queued-exp)", "FINISHED"),
        ("summary (queued-exp)", "FINISHED"),
    ]
    strays = [p for p in (repo / ".dvc").rglob("mlflow.db")] + list(
        (repo / ".dvc").rglob("mlartifacts")
    )
    assert strays == []  # the queued run's temporary copy logged nothing locally
    shown = _sh(repo, "dvc", "exp", "show", "--json")
    assert "queued-exp" in shown


def test_workspace_experiment_leaves_no_sweep_warnings_or_folders(repo: Path) -> None:
    """`dvc exp run` reads pipeline/sweep/dvc.yaml too; its never-run sweep outputs must not be
    'restored' (a warning each and an empty reports/sweep/<space>/ folder). The experiment
    changes the report's title: only `summarize` runs (one stage process, not seven), and the
    outputs are checked out as after any experiment."""
    commit(repo, "ws")
    cmd = ["dvc", "exp", "run", "-S", "summarize.title=ws", "-n", "ws-exp"]
    res = subprocess.run(
        cmd, cwd=repo, env=shell_env(), capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr
    assert "reports/sweep" not in res.stdout + res.stderr, res.stderr
    assert not (repo / "reports" / "sweep").exists()
