"""Accuracy against simulated time in the summaries, curves and plots (issue 30 item 3), on the
hand-made run folders of :mod:`.sim_time_runs` (known answers), and the reports of runs without a
``system`` section unchanged: byte for byte what the code before simulated time wrote
(``golden/sim_time_absent``, written by commit afd7f16's summarize stage from the same folders)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from fedcomm.comm.ledger import SCHEMA as LEDGER_SCHEMA
from fedcomm.config import ConfigError, Params, load_params, validate_params
from fedcomm.evaluation.sim_time import (
    best_within_time,
    sim_hours_to_target,
    sim_run_stats,
    sim_time_summary,
)
from fedcomm.evaluation.summaries import summarize_run
from fedcomm.reporting.compare import compare_runs
from fedcomm.reporting.plots import sim_time_curve
from fedcomm.stages.evaluate import evaluate_stage
from fedcomm.stages.partition import partition_stage
from fedcomm.stages.paths import Paths
from fedcomm.stages.summarize import summarize_stage
from fedcomm.stages.train import train_stage
from tests.conftest import tiny_params
from tests.unit.reporting.sim_time_runs import (
    curve_column,
    report_line,
    rounds_table,
    tree,
    write_runs,
)

GOLDEN = Path(__file__).parent / "golden" / "sim_time_absent"
RUNS = ["fedavg", "fedprox"]
H = 3600.0


def _params(**overrides: object) -> Params:
    return validate_params(
        tiny_params(**{"tracking.enabled": False, "experiment.seeds": [0, 1], **overrides})
    )


def test_without_system_columns_the_reports_are_what_they_were(project: Path) -> None:
    write_runs(Paths(), RUNS, [0, 1], system=False, budgets_gib=[0.0001], targets=[0.5])
    summarize_stage(_params(**{"evaluate.time_budgets_h": []}))
    reports = project / "reports"
    for name in ("summary.md", "summary.json", "curves.csv"):
        assert (reports / name).read_text() == (GOLDEN / name).read_text(), name
    assert tree(reports) == [
        "curves.csv",
        "curves.parquet",
        "dvc_plots_template.html",
        "interactive.html",
        "plots/accuracy_vs_round.png",
        "plots/global_accuracy_vs_gib.png",
        "plots/local_accuracy_vs_gib.png",
        "summary.json",
        "summary.md",
    ]


def test_time_budgets_without_simulated_time_are_noted_not_invented(project: Path) -> None:
    write_runs(Paths(), RUNS, [0, 1], system=False, targets=[0.5])
    summarize_stage(_params(**{"evaluate.time_budgets_h": [1.0]}))
    text = (project / "reports" / "summary.md").read_text()
    assert "evaluate.time_budgets_h ([1.0]) was not applied: no run has simulated time" in text
    assert "Simulated" not in text.replace("simulated time (`time/sim_elapsed_s`", "")
    metrics = json.loads((project / "reports" / "summary.json").read_text())
    assert "sim" not in metrics["fedavg"] and "at_time_budget_h" not in metrics["fedavg"]


def test_a_run_summary_gains_no_key_without_simulated_time() -> None:
    ledger = pl.DataFrame(schema=LEDGER_SCHEMA)
    clients = pl.DataFrame(schema={"round": pl.Int32, "client_id": pl.Int32, "train_s": pl.Float64})
    rounds = rounds_table("fedavg", 0, system=False)
    plain = summarize_run(rounds, ledger, clients, targets=[0.5])
    asked = summarize_run(rounds, ledger, clients, targets=[0.5], time_budgets_h=[1.0])
    assert asked == plain
    assert set(plain) == {"final", "best", "at_budget", "at_upload_cap", "to_target", "time"}
    assert set(plain["to_target"]["0.5"]) == {"round", "gib", "bytes", "tta_s"}


def test_accuracy_at_time_budgets_is_the_best_evaluation_within() -> None:
    s0, s1 = (rounds_table("fedavg", s, system=True) for s in (0, 1))
    # seed 0 evaluates 0.30 / 0.55 / 0.50 after 1500 / 3300 / 6000 simulated seconds
    assert best_within_time(s0, "global/accuracy", 0.25) is None  # 900 s: nothing evaluated
    assert best_within_time(s0, "global/accuracy", 1500 / H) == pytest.approx(0.30)  # inclusive
    assert best_within_time(s0, "global/accuracy", 1.0) == pytest.approx(0.55)
    assert best_within_time(s0, "global/accuracy", 2.0) == pytest.approx(0.55)  # best, not last
    # seed 1's rounds last twice as long: 0.40 / 0.60 / 0.65 after 3000 / 6600 / 12000 s
    assert best_within_time(s1, "global/accuracy", 1.0) == pytest.approx(0.40)
    assert best_within_time(s1, "topk/accuracy", 1.0) is None  # not measured
    assert best_within_time(rounds_table("fedavg", 0, system=False), "global/accuracy", 9) is None


def test_simulated_hours_to_a_target_count_the_reaching_round() -> None:
    s0, s1 = (rounds_table("fedavg", s, system=True) for s in (0, 1))
    assert sim_hours_to_target(s0, "global/accuracy", 0.5) == pytest.approx(3300 / H)
    assert sim_hours_to_target(s0, "global/accuracy", 0.3) == pytest.approx(1500 / H)
    assert sim_hours_to_target(s0, "global/accuracy", 0.6) is None  # never
    assert sim_hours_to_target(s1, "global/accuracy", 0.6) == pytest.approx(6600 / H)


def test_the_run_clock_and_client_counts() -> None:
    stats = sim_run_stats(rounds_table("fedavg", 0, system=True))
    assert stats["elapsed_h"] == pytest.approx(6000 / H)
    assert stats["round_s_mean"] == pytest.approx(1000.0)
    assert stats["sampled"] == 10.0 and stats["online"] == 9.0
    assert stats["finished"] == pytest.approx(41 / 6)
    assert stats["dropped"] == pytest.approx(19 / 6)
    assert stats["partial"] == pytest.approx(4 / 6)
    assert stats["dropped_share"] == pytest.approx(19 / 60)
    summary = sim_time_summary(
        rounds_table("fedavg", 0, system=True), time_budgets_h=[1, 0.25], targets=[0.5]
    )
    assert summary["at_time_budget"] == {"1": pytest.approx(0.55), "0.25": None}
    assert summary["to_target_sim_h"] == {"0.5": pytest.approx(3300 / H)}


def test_summarize_stage_reports_accuracy_against_simulated_time(project: Path) -> None:
    options: dict[str, Any] = {
        "budgets_gib": [0.0001], "targets": [0.5], "time_budgets_h": [1.0, 2.0]
    }  # fmt: skip
    write_runs(Paths(), RUNS, [0, 1], system=True, **options)
    written = summarize_stage(_params(**{"evaluate.time_budgets_h": [0.25, 1.0, 2.0]}))
    reports = project / "reports"
    assert Path("reports/plots/accuracy_vs_gib_and_sim_time.png") in written
    metrics = json.loads((reports / "summary.json").read_text())
    fedavg, fedprox = metrics["fedavg"], metrics["fedprox"]
    # 1 h: seed 0 best 0.55 (0.60 for fedprox), seed 1 0.40 (0.45): mean 0.475, SE 0.075
    assert fedavg["at_time_budget_h"]["1"] == pytest.approx(0.475)
    assert fedavg["at_time_budget_h"]["1_se"] == pytest.approx(0.075)
    assert fedprox["at_time_budget_h"]["1"] == pytest.approx(0.525)
    assert "0.25" not in fedavg["at_time_budget_h"]  # no evaluation within 15 minutes
    assert fedavg["sim"]["elapsed_h"] == pytest.approx((6000 + 12000) / 2 / H)
    assert fedavg["sim"]["dropped_share"] == pytest.approx(19 / 60)
    text = (reports / "summary.md").read_text()
    assert "## Simulated time" in text
    assert "| Run | ≤ 0.25 h | ≤ 1 h | ≤ 2 h |" in text
    assert "| `fedavg` | – | 47.50 ± 7.50 | 57.50 ± 2.50 |" in text  # 2 h: 0.55 and 0.60
    # targets: both clocks, and which is which; 0.5 after 3300 s and 6600 s = 1.375 ± 0.4583 h
    assert "| Time-to-accuracy (s) | Simulated time (h) |" in text
    assert "**Time-to-accuracy (s)** is the post-hoc model of `evaluate.link`" in text
    assert report_line(text, "| `fedavg` | 50%").endswith("| 1.375 ± 0.46 |")
    assert "![Global accuracy vs communication and vs simulated time]" in text
    assert curve_column(reports, "fedavg", 1, "sim_elapsed_s") == [3000.0, 6600.0, 12000.0]


def test_seeds_are_aligned_on_the_simulated_clock() -> None:
    tables = [rounds_table("fedavg", s, system=True) for s in (0, 1)]
    curve = sim_time_curve(tables, "global/accuracy")
    # seed 1 first evaluates at 3000 s, seed 0 last at 6000 s; between them each seed counts its
    # latest evaluation: (0.30, 0.40) at 3000 s, (0.55, 0.40) at 3300 s, (0.50, 0.40) at 6000 s
    assert curve.x == pytest.approx([3000 / H, 3300 / H, 6000 / H])
    assert curve.mean == pytest.approx([0.35, 0.475, 0.45])
    assert curve.se == pytest.approx([0.05, 0.075, 0.05])
    assert curve.seeds == 2
    one = sim_time_curve(tables[:1], "global/accuracy")
    assert one.x == pytest.approx([1500 / H, 3300 / H, 6000 / H]) and one.se == [0.0] * 3
    assert sim_time_curve([rounds_table("fedavg", 0, system=False)], "global/accuracy").x == []
    # seeds that never overlap in time (one evaluation each, after 1 h and 2 h): every time kept,
    # each point averaging the seeds evaluated by then
    late = [
        pl.DataFrame({"round": [1], "global/accuracy": [a], "time/sim_elapsed_s": [h * H]})
        for a, h in ((0.5, 1.0), (0.7, 2.0))
    ]
    apart = sim_time_curve(late, "global/accuracy")
    assert apart.x == [1.0, 2.0] and apart.mean == pytest.approx([0.5, 0.6])
    assert apart.se == pytest.approx([0.0, 0.1])  # one seed at 1 h, both at 2 h


@pytest.mark.parametrize("bad", [[-1.0], [0], [float("inf")], ["soon"]])
def test_time_budgets_are_checked_at_the_boundary(bad: list[object]) -> None:
    with pytest.raises(ConfigError, match=r"evaluate\.time_budgets_h"):
        _params(**{"evaluate.time_budgets_h": bad})


def test_a_trained_run_with_a_system_section_end_to_end(project: Path) -> None:
    """Train, evaluate and summarize the tiny experiment under ``system: {}`` (every client on
    the default links and reference compute): the summaries are the rounds table's clock."""
    raw = tiny_params(
        **{
            "tracking.enabled": False,
            "experiment.runs": ["fedavg"],
            "experiment.seeds": [0, 1],
            "train.system": {},
            "evaluate.targets": [0.01],
            "evaluate.time_budgets_h": [1e6],
        }
    )
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    params = load_params(project / "params.yaml")
    partition_stage(params)
    tables = []
    for seed in params.experiment.seeds:
        train_stage(params, "fedavg", seed, show_progress=False)
        evaluate_stage(params, "fedavg", seed)
        tables.append(pl.read_parquet(project / "runs" / f"fedavg-s{seed}/train/rounds.parquet"))
    run0 = project / "runs" / "fedavg-s0"
    own = json.loads((run0 / "summary.json").read_text())  # the run's own summary
    assert own["at_time_budget"]["1e+06"] == pytest.approx(
        max(tables[0]["global/accuracy"].drop_nulls())
    )
    assert (run0 / "plots" / "accuracy_vs_gib_and_sim_time.png").stat().st_size
    summarize_stage(params)
    metrics = json.loads((project / "reports" / "summary.json").read_text())["fedavg"]
    best = [max(t["global/accuracy"].drop_nulls()) for t in tables]  # 1e6 h: every evaluation
    assert metrics["at_time_budget_h"]["1e+06"] == pytest.approx(sum(best) / 2)
    elapsed = [float(t.sort("round")["time/sim_elapsed_s"][-1]) / H for t in tables]
    assert metrics["sim"]["elapsed_h"] == pytest.approx(sum(elapsed) / 2)
    curves = pl.read_csv(project / "reports" / "curves.csv").filter(pl.col("seed") == 0)
    evaluated = tables[0].filter(pl.col("global/accuracy").is_not_null()).sort("round")
    assert curves["sim_elapsed_s"].to_list() == pytest.approx(
        evaluated["time/sim_elapsed_s"].to_list()
    )
    text = (project / "reports" / "summary.md").read_text()
    assert "## Simulated time" in text and "accuracy_vs_gib_and_sim_time.png" in text
    assert (project / "reports" / "plots" / "accuracy_vs_gib_and_sim_time.png").stat().st_size


@pytest.mark.parametrize("bad", [[0.0], [-2.0], [float("inf")]])
def test_report_time_budgets_are_checked_before_any_run_is_read(
    tmp_path: Path, bad: list[float]
) -> None:
    with pytest.raises(ConfigError, match=r"time_budgets_h: .*finite and > 0 hours"):
        compare_runs("sqlite:///nowhere/none.db", tmp_path / "out", time_budgets_h=bad)
    assert not (tmp_path / "out").exists()
