"""The clients' energy (``system.energy``) in the summaries, curves and plots, on the hand-made run
folders of :mod:`.sim_time_runs` (known answers); a run with simulated time but no energy gains
nothing."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from fedcomm.config import Params, load_params, validate_params
from fedcomm.evaluation.headline import run_headline
from fedcomm.evaluation.sim_time import energy_run_stats, energy_to_target, sim_time_summary
from fedcomm.reporting.interactive import experiment_page
from fedcomm.reporting.plots import energy_curve
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
    write_runs,
)

RUNS = ["fedavg", "fedprox"]


def _params(**overrides: object) -> Params:
    return validate_params(
        tiny_params(**{"tracking.enabled": False, "experiment.seeds": [0, 1], **overrides})
    )


def test_a_runs_energy_and_the_joules_to_a_target() -> None:
    s0 = rounds_table("fedavg", 0, system=True, energy=True)
    stats = energy_run_stats(s0)
    assert stats["total_j"] == 1200.0
    assert stats["round_j_mean"] == pytest.approx(200.0)
    assert stats["compute_j"] == pytest.approx(600.0)
    assert stats["dropped_share"] == pytest.approx(0.1)
    assert energy_to_target(s0, "global/accuracy", 0.5) == 700.0  # reached in round 4
    assert energy_to_target(s0, "global/accuracy", 0.6) is None  # never
    summary = sim_time_summary(s0, targets=[0.5])
    assert summary["energy"] == stats
    assert summary["to_target_energy_j"] == {"0.5": 700.0}
    plain = sim_time_summary(rounds_table("fedavg", 0, system=True), targets=[0.5])
    assert "energy" not in plain and "to_target_energy_j" not in plain
    assert run_headline({"energy": stats}, metric="global/accuracy")["energy_j"] == 1200.0
    assert "energy_j" not in run_headline({}, metric="global/accuracy")


def test_summarize_stage_reports_the_clients_energy(project: Path) -> None:
    write_runs(Paths(), RUNS, [0, 1], system=True, energy=True, targets=[0.5])
    written = summarize_stage(_params())
    reports = project / "reports"
    assert Path("reports/plots/accuracy_vs_energy.png") in written
    assert (reports / "plots" / "accuracy_vs_energy.png").stat().st_size
    fedavg = json.loads((reports / "summary.json").read_text())["fedavg"]
    # seed 0 spends 1200 J, seed 1 3600 J: mean 2400, SE 1200
    assert fedavg["energy"]["total_j"] == pytest.approx(2400.0)
    assert fedavg["energy"]["total_j_se"] == pytest.approx(1200.0)
    assert fedavg["energy"]["dropped_share"] == pytest.approx(0.1)
    text = (reports / "summary.md").read_text()
    assert "## Energy" in text
    cells = "2.40 ± 1.2 | 400 ± 200 | 0.480 ± 0.24 | 1.20 ± 0.60 | 0.720 ± 0.36 | 10.00"
    row = report_line(text, "| `fedavg` | 2 | 2.40")  # kJ, J, kJ, kJ, kJ, % of the joules
    assert row == f"| `fedavg` | 2 | {cells} |"
    # 0.5 reached in round 4: after 700 J (seed 0) and 2100 J (seed 1): 1.4 ± 0.7 kJ
    assert "| Simulated time (h) | Energy (kJ) |" in text
    assert report_line(text, "| `fedavg` | 50%").endswith("| 1.375 ± 0.46 | 1.4 ± 0.7 |")
    assert "![Global accuracy vs the clients' energy](plots/accuracy_vs_energy.png)" in text
    assert curve_column(reports, "fedavg", 1, "energy_cum_j") == [900.0, 2100.0, 3600.0]
    assert "against the clients' cumulative energy" in (reports / "interactive.html").read_text()


def test_simulated_time_without_energy_reports_no_energy(project: Path) -> None:
    write_runs(Paths(), RUNS, [0, 1], system=True, targets=[0.5])
    written = summarize_stage(_params())
    reports = project / "reports"
    assert not [p for p in written if "energy" in p.name]
    assert "energy" not in json.loads((reports / "summary.json").read_text())["fedavg"]
    text = (reports / "summary.md").read_text()
    assert "Energy" not in text and "energy" not in text
    assert "energy_cum_j" not in pl.read_csv(reports / "curves.csv").columns


def test_seeds_are_aligned_on_their_clients_energy() -> None:
    tables = [rounds_table("fedavg", s, system=True, energy=True) for s in (0, 1)]
    curve = energy_curve(tables, "global/accuracy")
    # seed 0 evaluates at 300, 700, 1200 J; seed 1 at 900, 2100, 3600 J: both from 900 to 1200
    assert curve.x == pytest.approx([0.9, 1.2])  # kJ
    assert curve.mean == pytest.approx([(0.55 + 0.40) / 2, (0.50 + 0.40) / 2])
    page = experiment_page(
        pl.DataFrame(
            {
                "run": ["a"] * 3,
                "seed": [0] * 3,
                "round": [2, 4, 6],
                "cum_gib": [0.1, 0.2, 0.3],
                "global_accuracy": [0.3, 0.5, 0.6],
                "energy_cum_j": [300.0, 700.0, 1200.0],
            }
        ),
        title="t",
    )
    assert "the clients' cumulative energy (kJ)" in page


def test_a_trained_run_with_energy_end_to_end(project: Path) -> None:
    """Train, evaluate and summarize the tiny experiment with ``system.energy``: the run's
    summary, headline and plots carry the rounds table's joules."""
    raw = tiny_params(
        **{
            "tracking.enabled": False,
            "experiment.runs": ["fedavg"],
            "experiment.seeds": [0],
            "train.system": {
                "energy": {
                    "links": {"down": "lte", "up": "lte"},
                    "compute": {"kind": "constant", "j_per_flop": 1e-9},
                }
            },
            "evaluate.targets": [0.01],
        }
    )
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    params = load_params(project / "params.yaml")
    partition_stage(params)
    train_stage(params, "fedavg", 0, show_progress=False)
    evaluate_stage(params, "fedavg", 0)
    run = project / "runs" / "fedavg-s0"
    rounds = pl.read_parquet(run / "train" / "rounds.parquet").sort("round")
    clients = pl.read_parquet(run / "train" / "clients.parquet")
    assert clients["energy_j"].sum() == pytest.approx(float(rounds["energy/cum_j"][-1]))
    own = json.loads((run / "summary.json").read_text())
    assert own["energy"]["total_j"] == float(rounds["energy/cum_j"][-1])
    assert own["to_target"]["0.01"]["energy_j"] == float(rounds["energy/cum_j"][0])
    assert json.loads((run / "metrics.json").read_text())["energy_j"] == own["energy"]["total_j"]
    assert (run / "plots" / "accuracy_vs_energy.png").stat().st_size
    summarize_stage(params)
    text = (project / "reports" / "summary.md").read_text()
    assert "## Energy" in text and "accuracy_vs_energy.png" in text
