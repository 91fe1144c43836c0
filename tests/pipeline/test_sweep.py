"""`fedcomm sweep` end to end on digits: real Optuna studies (journal storage), real MLflow runs
nested under the study's run, the outputs, resume, crashed and killed trials, pruning, Pareto."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import optuna
import polars as pl
import pytest
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.sweep.study import run_sweep
from tests.conftest import REPO, tiny_params

pytestmark = pytest.mark.slow

LR = "train.local.lr"
LAMBDA0 = "algorithms.fedsparse.lambda0"


def setup(project: Path, name: str = "study", **space: Any) -> Path:
    """A tiny base (digits, 8 clients, 3 rounds, FedSparse) and a space file in ``project``."""
    base = tiny_params(**{"algorithms.fedsparse": {"name": "fedsparse"}})
    base["algorithms"] = {"fedsparse": {"name": "fedsparse", "server": {"optimizer": "sgd"}}}
    base["experiment"]["runs"] = ["fedsparse"]
    (project / "base.yaml").write_text(yaml.safe_dump(base))
    doc: dict[str, Any] = {
        "base": "base.yaml",
        "run": "fedsparse",
        "trials": 3,
        "seeds": [0],
        "sampler": {"name": "random", "seed": 0},
        "space": {
            LAMBDA0: {"type": "float", "low": 1e-6, "high": 1e-2, "log": True},
            LR: {"type": "float", "low": 0.02, "high": 0.3, "log": True},
        },
    }
    doc.update(space)
    path = project / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def load(project: Path, name: str = "study") -> optuna.Study:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(project / ".optuna" / f"{name}.log"))
    )
    return optuna.load_study(study_name=name, storage=storage)


def mlflow_runs(project: Path, study: str) -> tuple[list[Any], list[Any]]:
    """(study parent runs, training runs) of ``study``."""
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    exp = client.get_experiment_by_name(f"sweep/{study}")
    assert exp is not None
    runs = client.search_runs([exp.experiment_id], f"tags.`fedcomm.study` = '{study}'")
    parents = [r for r in runs if r.data.tags.get("fedcomm.kind") == "study"]
    trained = [r for r in runs if r.data.tags.get("fedcomm.kind") == "train"]
    return parents, trained


def kill_worker_after_round_2(project: Path, space: Path) -> None:
    """A `fedcomm sweep` worker process SIGKILLed after round 2 of its first trial."""
    env = {**os.environ, "FEDCOMM_KILL_AFTER_ROUND": "2", "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run(
        [sys.executable, "-m", "fedcomm.cli", "sweep", str(space)],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -9, proc.stderr[-2000:]


def test_three_trial_study_end_to_end(project: Path, data_root: Path) -> None:
    space = setup(project)
    res = CliRunner().invoke(app, ["sweep", str(space)])
    assert res.exit_code == 0, (res.output, res.exception)
    assert "3 finished, 0 failed" in res.output

    study = load(project)
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 3
    parents, trained = mlflow_runs(project, "study")
    assert len(parents) == 1 and len(trained) == 3  # one nested run per trial, exactly once
    assert study.user_attrs["mlflow_parent_run_id"] == parents[0].info.run_id
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    by_id = {r.info.run_id: r for r in trained}
    for t in trials:
        run = by_id[t.user_attrs["mlflow_run_id"]]
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert run.data.tags["optuna.trial_number"] == str(t.number)
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "global/accuracy")
        assert [m.step for m in history] == [1, 2, 3]  # the per-round curve
        # objective = final accuracy: the mean of the last evaluate.last_k (5) evaluations
        assert t.values[0] == pytest.approx(sum(m.value for m in history[-5:]) / len(history[-5:]))
        assert run.data.params["train.local.lr"] == str(t.params[LR])  # the sampled value ran
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"model.safetensors", "rounds.parquet", "metrics.json", "summary.json"} <= artifacts

    out = project / "reports" / "sweep" / "study"
    table = pl.read_parquet(out / "trials.parquet")
    assert table.height == 3 and table["state"].to_list() == ["COMPLETE"] * 3
    assert table[f"param:{LR}"].to_list() == [t.params[LR] for t in trials]
    for png in ("pareto.png", "history.png"):
        assert (out / png).stat().st_size > 10_000
    best = yaml.safe_load((out / "best_params.yaml").read_text())
    assert best["trial"] == study.best_trial.number and best["params"] == study.best_trial.params
    args = CliRunner().invoke(app, ["sweep-args", str(out / "best_params.yaml")])
    assert args.exit_code == 0 and f"-S ++{LR}=" in args.output
    assert "Top trials" in (out / "summary.md").read_text()
    parent_files = {a.path for a in client.list_artifacts(parents[0].info.run_id, "sweep")}
    assert "sweep/trials.parquet" in parent_files
    assert parents[0].info.status == "FINISHED"


def test_rerun_continues_and_same_seed_samples_the_same(project: Path, data_root: Path) -> None:
    space = setup(project)
    first = run_sweep(space, trials=2)
    assert (first.finished, first.failed) == (2, 0)
    before = {t.number: (t.params, t.values, t.datetime_start) for t in load(project).trials}
    again = run_sweep(space, trials=3)  # continues: one more trial, the first two untouched
    study = load(project)
    assert again.finished == 3 and len(study.trials) == 3
    for t in study.trials[:2]:
        assert (t.params, t.values, t.datetime_start) == before[t.number]
    assert run_sweep(space, trials=3).finished == 3 and len(load(project).trials) == 3

    # a second study from the same seed samples the same values and gets the same numbers
    twin = setup(project, "twin")
    run_sweep(twin, trials=2)
    for a, b in zip(load(project, "twin").trials, study.trials[:2], strict=True):
        assert a.params == b.params and a.values == b.values

    # continuing under a changed space is refused, by name
    doc = yaml.safe_load(space.read_text())
    doc["space"][LR]["high"] = 0.5
    space.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(app, ["sweep", str(space)])
    assert res.exit_code == 2 and "different search space" in res.output


def test_failed_trial_is_recorded_and_the_study_goes_on(project: Path, data_root: Path) -> None:
    # 8 clients of >= 1000 digits each cannot be drawn from 1797: that trial fails at run time
    space = setup(
        project,
        trials=3,
        max_failures=10,
        space={
            "partition.min_partition_size": {"type": "categorical", "choices": [20, 1000]},
            LR: {"type": "float", "low": 0.02, "high": 0.3},
        },
    )
    result = run_sweep(space)
    study = load(project)
    states = [t.state.name for t in study.trials]
    assert result.finished == 3 and states.count("COMPLETE") == 3
    failed = [t for t in study.trials if t.state.name == "FAIL"]
    assert failed, "seed 0 samples 50 at least once"
    for t in failed:
        assert t.params["partition.min_partition_size"] == 1000
        assert "PartitionError" in t.user_attrs["error"]
    table = pl.read_parquet(project / "reports" / "sweep" / "study" / "trials.parquet")
    assert table.filter(pl.col("state") == "FAIL")["error"].null_count() == 0


def test_killed_worker_trial_is_retried_from_its_checkpoint(project: Path, data_root: Path) -> None:
    space = setup(project, trials=1)
    kill_worker_after_round_2(project, space)
    (stale,) = load(project).trials
    assert stale.state.name == "RUNNING"

    result = run_sweep(space)  # the next worker fails the dead trial and re-runs its values
    study = load(project)
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"]
    retry = study.trials[1]
    assert retry.user_attrs["retry_of"] == 0 and retry.params == stale.params
    assert result.finished == 1
    # resumed from the round-2 checkpoint: the same MLflow run, each round logged once
    assert retry.user_attrs["mlflow_run_id"] == stale.user_attrs["mlflow_run_id"]
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    history = client.get_metric_history(retry.user_attrs["mlflow_run_id"], "global/accuracy")
    assert [m.step for m in history] == [1, 2, 3]
    _, trained = mlflow_runs(project, "study")
    assert len(trained) == 1 and trained[0].data.tags["optuna.trial_number"] == "1"


def test_median_pruner_stops_a_hopeless_trial(project: Path, data_root: Path) -> None:
    space = setup(
        project,
        trials=4,
        pruner={"name": "median", "startup_trials": 1, "warmup_rounds": 0},
        space={LR: {"type": "categorical", "choices": [0.2, 1e-7]}},
    )
    run_sweep(space)
    study = load(project)
    pruned = [t for t in study.trials if t.state.name == "PRUNED"]
    assert pruned, "seed 0 samples lr 1e-7 after a complete lr 0.2 trial"
    good = [t.number for t in study.trials if t.state.name == "COMPLETE" and t.params[LR] == 0.2]
    assert good and min(good) < min(t.number for t in pruned)
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    run_ids = [t.user_attrs["mlflow_run_id"] for t in study.trials]
    assert len(set(run_ids)) == len(run_ids)  # same values never share a run or a checkpoint
    for t in pruned:
        assert t.params[LR] == 1e-7 and len(t.intermediate_values) < 3
        run = client.get_run(t.user_attrs["mlflow_run_id"])
        assert run.info.status == "KILLED" and "pruned" in run.data.tags["fedcomm.stopped"]


def test_multi_objective_writes_the_pareto_front(project: Path, data_root: Path) -> None:
    space = setup(
        project,
        trials=5,
        objective={"kind": "multi", "metric": "global/accuracy", "comm": "total"},
        space={
            LAMBDA0: {"type": "float", "low": 1e-6, "high": 0.5, "log": True},
            LR: {"type": "float", "low": 0.02, "high": 0.3},
        },
    )
    run_sweep(space)
    study = load(project)
    assert [d.name for d in study.directions] == ["MAXIMIZE", "MINIMIZE"]
    out = project / "reports" / "sweep" / "study"
    table = pl.read_parquet(out / "trials.parquet").filter(pl.col("state") == "COMPLETE")
    acc, gib = "value:final:global/accuracy", "value:comm/total_gib"
    points = list(zip(table[acc], table[gib], table["pareto"], strict=True))

    def dominated(p: tuple[float, float, bool]) -> bool:
        return any(q[0] >= p[0] and q[1] <= p[1] and (q[0], q[1]) != (p[0], p[1]) for q in points)

    assert any(p[2] for p in points)
    for p in points:
        assert p[2] == (not dominated(p))
    assert {t.number for t in study.best_trials} == set(table.filter(pl.col("pareto"))["number"])
    best = yaml.safe_load((out / "best_params.yaml").read_text())
    front = table.filter(pl.col("pareto"))
    assert best["objective"]["final:global/accuracy"] == front[acc].max()
    assert (out / "pareto.png").stat().st_size > 10_000


def test_several_seeds_nest_under_a_trial_run_and_survive_a_kill(
    project: Path, data_root: Path
) -> None:
    space = setup(project, trials=1, seeds=[0, 1], pruner={"name": "none"})
    kill_worker_after_round_2(project, space)
    run_sweep(space)
    study = load(project)
    dead, retry = study.trials
    assert (dead.state.name, retry.state.name) == ("FAIL", "COMPLETE")
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    assert client.get_run(dead.user_attrs["mlflow_run_id"]).info.status == "FAILED"
    trial_run = client.get_run(retry.user_attrs["mlflow_run_id"])
    assert trial_run.info.status == "FINISHED"
    assert trial_run.data.tags["fedcomm.kind"] == "trial"
    parents, trained = mlflow_runs(project, "study")
    assert trial_run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
    assert sorted(r.data.tags["seed"] for r in trained) == ["0", "1"]  # seed 0 resumed, not redone
    finals = []
    for r in trained:
        assert r.info.status == "FINISHED"
        assert r.data.tags["mlflow.parentRunId"] == trial_run.info.run_id
        history = client.get_metric_history(r.info.run_id, "global/accuracy")
        assert [m.step for m in history] == [1, 2, 3]
        finals.append(sum(m.value for m in history[-5:]) / len(history[-5:]))  # final: last 5
    assert retry.values[0] == pytest.approx(sum(finals) / 2)  # objective = mean over seeds
    assert trial_run.data.metrics["objective/final:global/accuracy"] == pytest.approx(
        retry.values[0]
    )
