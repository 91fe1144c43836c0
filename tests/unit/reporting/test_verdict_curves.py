"""``fedcomm curves``: the long curves table of a build's finished runs, unfinished ones skipped."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.config import load_params
from fedcomm.reporting.curves import finished_runs, long_curves
from fedcomm.stages.partition import partition_stage
from fedcomm.stages.paths import Paths
from fedcomm.stages.train import StopRun, train_stage
from tests.conftest import tiny_params


def _stop_at_2(round_: int, metrics: object) -> None:
    if round_ == 2:
        raise StopRun("killed mid-run")


def test_curves_of_a_tiny_build_skip_the_unfinished_run(project: Path) -> None:
    raw = tiny_params(
        **{"tracking.enabled": False, "train.eval_every": 2, "experiment.seeds": [0, 1]}
    )
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    params = load_params(project / "params.yaml")
    partition_stage(params)
    train_stage(params, "fedavg", 0, show_progress=False)
    with pytest.raises(StopRun):  # killed after round 2: a checkpoint, no outputs
        train_stage(params, "fedprox", 0, show_progress=False, on_round=_stop_at_2)
    assert (Paths().checkpoints / "fedprox-s0" / "state.pt").is_file()
    out = project / "curves" / "tiny.csv"
    res = CliRunner().invoke(app, ["curves", "--build", str(project), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "skipped fedprox-s0: still training (no train/run.json)" in res.output
    assert "skipped fedavg-s1: not started" in res.output
    table = pl.read_csv(out)
    assert set(table.select("run", "seed").unique().iter_rows()) == {("fedavg", 0)}
    rounds = pl.read_parquet(project / "runs" / "fedavg-s0" / "train" / "rounds.parquet")
    assert table["round"].to_list() == rounds["round"].to_list()  # local accuracy every round
    assert table["global_accuracy"].to_list() == rounds["global/accuracy"].to_list()
    assert table["global_accuracy"].null_count() == 1  # round 1 (2 and the last: evaluated)
    for column in ("local_accuracy", "comm_cum_gib", "comm_cum_up_bytes", "model_sparsity"):
        assert column in table.columns
    # the train stage's run.json is written last: without it the run is not finished
    (project / "runs" / "fedavg-s0" / "train" / "run.json").unlink()
    res = CliRunner().invoke(app, ["curves", "--build", str(project), "--out", str(out)])
    assert res.exit_code == 2 and "no finished run" in res.output


def test_a_run_json_that_disagrees_with_the_rounds_is_not_finished(tmp_path: Path) -> None:
    train = tmp_path / "runs" / "x-s3" / "train"
    train.mkdir(parents=True)
    pl.DataFrame({"round": [1, 2]}).write_parquet(train / "rounds.parquet")
    (train / "run.json").write_text(json.dumps({"rounds": 5}))
    found = finished_runs(tmp_path)
    assert found.finished == []
    assert found.unfinished == ["x-s3: train/rounds.parquet ends at round 2, run.json says 5"]
    (train / "run.json").write_text(json.dumps({"rounds": 2}))
    assert finished_runs(tmp_path).finished == [("x", 3, train)]


def test_long_curves_keeps_evaluation_rounds_and_chosen_columns() -> None:
    t = pl.DataFrame(
        {
            "round": [3, 1, 2],
            "global/accuracy": [0.3, None, None],
            "local/accuracy": [None, 0.1, None],
            "comm/cum_gib": [3.0, 1.0, 2.0],
        }
    )
    every = long_curves([("r", 7, t)])
    assert every.columns == [
        "run",
        "seed",
        "round",
        "global_accuracy",
        "local_accuracy",
        "comm_cum_gib",
    ]
    assert every["round"].to_list() == [1, 3]  # round 2 evaluated nothing
    chosen = long_curves([("r", 7, t)], {"comm/cum_gib": "cum_gib"}, ["global/accuracy"])
    assert chosen.rows() == [("r", 7, 3, 3.0)]
