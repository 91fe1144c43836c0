"""``compare_runs`` on a real MLflow store: two algorithms x two seeds trained, evaluated and
compared from the store alone (tables downloaded from the runs' artifacts), no mocks."""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Iterator
from pathlib import Path

import polars as pl
import pytest
import yaml
from mlflow import MlflowClient

from fedcomm.config import ConfigError, Params
from fedcomm.evaluation.curve_points import first_round_reaching
from fedcomm.reporting.compare import compare_runs
from fedcomm.reporting.summary import format_value
from fedcomm.stages.evaluate import evaluate_stage
from fedcomm.stages.partition import partition_stage
from fedcomm.stages.paths import Paths
from fedcomm.stages.train import train_stage
from fedcomm.tracking.mlflow import resolve_tracking_uri
from fedcomm.tracking.query import download_tables, find_runs, run_filter
from tests.conftest import tiny_params

RUNS = ("fedavg", "fedprox")
SEEDS = (0, 1)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _params(**overrides: object) -> Params:
    raw = tiny_params(**{"experiment.seeds": list(SEEDS), "train.rounds": 2, **overrides})
    return Params.model_validate(raw)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A project (as the ``project`` fixture, shared by the module) with 2 runs x 2 seeds
    trained and evaluated into its own ``mlflow.db``, experiment ``tests``."""
    root = tmp_path_factory.mktemp("compare")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("FEDCOMM_PROJECT_ROOT", str(root))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("DVC_EXP_NAME", raising=False)
        params = _params()
        (root / "params.yaml").write_text(yaml.safe_dump(params.model_dump(mode="json")))
        partition_stage(params)
        for run in RUNS:
            for seed in SEEDS:
                train_stage(params, run, seed, show_progress=False)
                evaluate_stage(params, run, seed)
        yield root


def _final(root: Path, run: str, seed: int) -> float:
    metrics = json.loads((root / Paths().run_dir(run, seed) / "summary.json").read_text())
    return float(metrics["final"]["global/accuracy"])


def _table_rows(markdown: str, header: str) -> dict[str, list[str]]:
    """The rows of the markdown table after ``header``, keyed by the first cell."""
    block = markdown.split(header, 1)[1].split("\n## ", 1)[0]
    rows = [line for line in block.splitlines() if line.startswith("| `")]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    return {c[0].strip("`"): c[1:] for c in cells}


def test_report_is_mean_and_se_over_seeds_per_run(store: Path) -> None:
    written = compare_runs(None, store / "cmp", experiments=["tests"])
    md = (store / "cmp" / "summary.md").read_text()
    results = _table_rows(md, "## Results")
    assert set(results) == set(RUNS)
    for run in RUNS:
        finals = [_final(store, run, s) for s in SEEDS]
        seeds, final_global = results[run][0], results[run][1]
        assert seeds == "2"
        se = statistics.stdev(finals) / math.sqrt(2)
        assert final_global == format_value(statistics.fmean(finals), se, "percent", seeds=2)

    runs = pl.read_parquet(store / "cmp" / "runs.parquet")
    assert runs.height == 4
    assert sorted(runs["group"].unique()) == list(RUNS)
    for row in runs.iter_rows(named=True):
        assert row["experiment"] == "tests"
        assert row["final_global_accuracy"] == _final(store, row["group"], row["seed"])  # exact
        assert row["run_id"] in md  # the Runs section names every MLflow run
        run_json = store / Paths().train_dir(row["group"], row["seed"]) / "run.json"
        assert json.loads(run_json.read_text())["mlflow_run_id"] == row["run_id"]
    assert runs.group_by("group").agg(pl.col("seed").sort())["seed"].to_list() == [[0, 1]] * 2

    pngs = [p for p in written if p.suffix == ".png"]
    assert len(pngs) == 3
    for png in pngs:
        assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 1000
    assert {p.name for p in written} >= {"summary.md", "runs.parquet"}
    assert not list((store / "cmp").rglob(".*.tmp"))  # atomic writes leave no temporaries


def test_tag_filter_selects_one_group(store: Path) -> None:
    compare_runs(None, store / "one", experiments=["tests"], tags={"run": "fedavg"})
    runs = pl.read_parquet(store / "one" / "runs.parquet")
    assert runs["group"].to_list() == ["fedavg", "fedavg"]
    assert set(_table_rows((store / "one" / "summary.md").read_text(), "## Results")) == {"fedavg"}


def test_group_by_algorithm_tag(store: Path) -> None:
    compare_runs(None, store / "algo", experiments=["tests"], group_by="algorithm")
    assert sorted(pl.read_parquet(store / "algo" / "runs.parquet")["group"].unique()) == [
        "fedavg",
        "fedprox",
    ]


def test_time_to_target_reports_the_first_round_reaching_it(store: Path) -> None:
    compare_runs(None, store / "tta", experiments=["tests"], targets=[0.01], budgets_gib=[1.0])
    md = (store / "tta" / "summary.md").read_text()
    rows = _table_rows(md, "## Reaching a target global accuracy")
    for run in RUNS:
        firsts = [
            first_round_reaching(
                pl.read_parquet(store / Paths().train_dir(run, s) / "rounds.parquet"),
                "global/accuracy",
                0.01,
            )
            for s in SEEDS
        ]
        assert firsts == [1, 1]  # 10 classes: any trained model beats 1% after one round
        target, reached, round_, gib, tta = rows[run]
        assert (target, reached, round_) == ("1%", "2/2", "1")
        assert float(gib) > 0 and float(tta.split(" ± ")[0]) > 0
    assert "## Best global accuracy (%) within a communication budget" in md


def test_unknown_experiment_is_named(store: Path) -> None:
    with pytest.raises(ConfigError, match=r"'nope'.*existing: .*tests"):
        compare_runs(None, store / "x", experiments=["nope"])


def test_nothing_matching_names_the_filter(store: Path) -> None:
    with pytest.raises(ConfigError, match=r"no finished .*run=nothing"):
        compare_runs(None, store / "x", experiments=["tests"], tags={"run": "nothing"})


def test_missing_group_tag_is_named(store: Path) -> None:
    with pytest.raises(ConfigError, match=r"no tag 'no_such_tag'"):
        compare_runs(None, store / "x", experiments=["tests"], group_by="no_such_tag")


def test_a_rerun_keeps_the_newest_run(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(store)
    monkeypatch.setenv("FEDCOMM_PROJECT_ROOT", str(store))
    monkeypatch.setenv("DVC_EXP_NAME", "again")
    params = _params(**{"tracking.experiment": "reruns"})  # leaves experiment "tests" as it is
    paths = Paths(runs=Path("runs-again"), checkpoints=Path(".fedcomm/again"))  # and runs/
    first = train_stage(params, "fedavg", 0, paths, show_progress=False)
    old = json.loads((first / "run.json").read_text())["mlflow_run_id"]
    second = train_stage(params, "fedavg", 0, paths, show_progress=False)
    new = json.loads((second / "run.json").read_text())["mlflow_run_id"]
    assert old != new and os.environ["DVC_EXP_NAME"] == "again"

    compare_runs(None, store / "rerun", experiments=["reruns"], dvc_exp="again")
    runs = pl.read_parquet(store / "rerun" / "runs.parquet")
    assert runs["run_id"].to_list() == [new]
    assert runs["dvc_exp"].to_list() == ["again"]
    notes = (store / "rerun" / "summary.md").read_text().split("## Notes", 1)[1]
    assert "re-run" in notes and old in notes and new in notes

    # seed 0 of `fedavg` now exists in two experiments: kept apart, and the report says so
    both = ["tests", "reruns"]
    compare_runs(None, store / "mixed", experiments=both, tags={"run": "fedavg"})
    mixed = pl.read_parquet(store / "mixed" / "runs.parquet")
    assert sorted(mixed["seed"].to_list()) == [0, 0, 1]
    assert old not in mixed["run_id"].to_list()
    notes = (store / "mixed" / "summary.md").read_text().split("## Notes", 1)[1]
    assert "`fedavg` has several runs of seed(s) 0" in notes and "again" in notes


def test_only_training_runs_are_found(store: Path) -> None:
    """Sweep studies/trials, runs without a `run` tag or without rounds.parquet are skipped."""
    client = MlflowClient(tracking_uri=resolve_tracking_uri(None, store))
    exp = client.create_experiment("mixed-kinds", artifact_location=(store / "art").as_uri())
    rounds = store / Paths().train_dir("fedavg", 0) / "rounds.parquet"
    kinds: dict[str, dict[str, str]] = {
        "study": {"run": "fedavg", "fedcomm.kind": "study"},
        "trial": {"run": "fedavg", "fedcomm.kind": "trial"},
        "untagged": {"algorithm": "fedavg"},
        "train": {"run": "fedavg", "fedcomm.kind": "train", "seed": "0"},
    }
    ids = {}
    for name, tags in kinds.items():
        ids[name] = client.create_run(exp, run_name=name, tags=tags).info.run_id
        client.log_artifact(ids[name], str(rounds))
        client.set_terminated(ids[name])
    no_table = client.create_run(exp, run_name="no-table", tags={"run": "fedavg"}).info.run_id
    client.set_terminated(no_table)
    unfinished = client.create_run(exp, run_name="running", tags={"run": "fedavg"}).info.run_id
    client.log_artifact(unfinished, str(rounds))

    found = find_runs(None, experiments=["mixed-kinds"])
    assert [(r.run_id, r.experiment, r.seed) for r in found] == [(ids["train"], "mixed-kinds", 0)]
    assert "rounds.parquet" in found[0].artifacts
    assert {r.run_id for r in find_runs(None, experiments=["mixed-kinds"], status=None)} == {
        ids["train"],
        unfinished,
    }
    with pytest.raises(ConfigError, match=r"cannot download artifact 'ledger\.parquet'"):
        download_tables(None, ids["train"], store / "dl")


def test_dotted_tags_and_quotes_make_valid_filters(store: Path) -> None:
    assert run_filter({"a'b": "x'y"}, dvc_exp="e", status=None) == (
        "tags.`a'b` = \"x'y\" and tags.`dvc.exp_name` = 'e'"
    )
    assert find_runs(None, experiments=["tests"], tags={"partition_hash": "it's"}) == []
    workspace = find_runs(None, experiments=["tests"], dvc_exp="")  # not a DVC experiment
    assert len(workspace) == 4
    assert {r.run_id for r in workspace} <= {r.run_id for r in find_runs(None)}  # all experiments
    with pytest.raises(ConfigError, match="both"):
        run_filter({"k": "'\""})


def test_report_command_line(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from fedcomm.cli import app

    monkeypatch.chdir(store)
    monkeypatch.setenv("FEDCOMM_PROJECT_ROOT", str(store))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cli = CliRunner()
    args = ["report", "-e", "tests", "--tag", "run=fedprox", "--target", "0.01", "--out", "cli"]
    res = cli.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert (store / "cli" / "summary.md").is_file() and "runs.parquet" in res.output
    assert pl.read_parquet(store / "cli" / "runs.parquet")["group"].to_list() == ["fedprox"] * 2
    bad = cli.invoke(app, ["report", "--tag", "run", "--out", "cli2"])
    assert bad.exit_code == 2 and "--tag 'run': expected KEY=VALUE" in bad.output
    missing = cli.invoke(app, ["report", "-e", "nope", "--out", "cli3"])
    assert missing.exit_code == 2 and "nope" in missing.output
    # --last-k: final = the mean of each run's last k evaluations (here the last one)
    last = cli.invoke(app, ["report", "-e", "tests", "--last-k", "1", "--out", "cli4"])
    assert last.exit_code == 0, last.output
    runs = pl.read_parquet(store / "cli4" / "runs.parquet")
    for row in runs.iter_rows(named=True):
        table = store / Paths().train_dir(row["group"], row["seed"]) / "rounds.parquet"
        evaluated = pl.read_parquet(table).sort("round")["global/accuracy"].drop_nulls()
        assert row["final_global_accuracy"] == pytest.approx(evaluated[-1])
    text = (store / "cli4" / "summary.md").read_text()
    assert "final = the last evaluation" in text
    zero = cli.invoke(app, ["report", "-e", "tests", "--last-k", "0", "--out", "cli5"])
    assert zero.exit_code == 2 and "--last-k" in zero.output


def test_runs_of_one_name_but_different_config_are_separate_groups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fedprox at mu 0.1 and at mu 0.5 (2 seeds each, one run name, as `dvc exp run -S
    algorithms.fedprox.mu=0.5` makes) are two rows of 2 seeds, labelled by the param that differs,
    never one row of 4 seeds."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDCOMM_PROJECT_ROOT", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    finals: dict[float, list[float]] = {}
    for mu in (0.1, 0.5):
        params = _params(**{"algorithms.fedprox.mu": mu, "experiment.runs": ["fedprox"]})
        partition_stage(params)
        for seed in SEEDS:
            train_stage(params, "fedprox", seed, show_progress=False)
            evaluate_stage(params, "fedprox", seed)
            finals.setdefault(mu, []).append(_final(tmp_path, "fedprox", seed))
    compare_runs(None, tmp_path / "report", experiments=["tests"])
    runs = pl.read_parquet(tmp_path / "report" / "runs.parquet")
    labels = {"fedprox [algorithm.mu=0.1]": 0.1, "fedprox [algorithm.mu=0.5]": 0.5}
    assert sorted(runs["group"].unique()) == sorted(labels)
    rows = _table_rows((tmp_path / "report" / "summary.md").read_text(), "## Results")
    for label, mu in labels.items():
        assert rows[label][0] == "2"  # seeds
        mean = statistics.mean(finals[mu])
        se = statistics.stdev(finals[mu]) / math.sqrt(2)
        assert rows[label][1] == format_value(mean, se, "percent", seeds=2)
