"""Optuna objectives on the simulated clock (issue 30): accuracy at a simulated-time budget and
simulated hours to a target accuracy (minimized; a miss is pruned or counts ``penalty_h``), their
running values for the pruner, their scores on a hand-made run table and their validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from pydantic import ValidationError

from fedcomm.config import ConfigError
from fedcomm.evaluation.curve_points import LAST_K
from fedcomm.sweep.outputs import pareto_mask, render_summary
from fedcomm.sweep.space import Objective, Sweep, load_sweep
from fedcomm.sweep.trial import Intermediate, TargetMissed, score
from tests.conftest import tiny_params
from tests.unit.sweep.test_objective import table as plain_table
from tests.unit.sweep.test_space import space_with, write

H = 3600.0
# evaluated at rounds 2-4 after 0.5, 1.25 and 2 simulated hours
ROUNDS = [
    {"global/accuracy": None, "comm/cum_gib": 0.1, "time/sim_elapsed_s": 0.25 * H},
    {"global/accuracy": 0.5, "comm/cum_gib": 0.2, "time/sim_elapsed_s": 0.5 * H},
    {"global/accuracy": 0.7, "comm/cum_gib": 0.3, "time/sim_elapsed_s": 1.25 * H},
    {"global/accuracy": 0.6, "comm/cum_gib": 0.4, "time/sim_elapsed_s": 2.0 * H},
]


def feed(objective: Objective) -> list[float | None]:
    running = Intermediate(objective, LAST_K)
    return [running.update(m) for m in ROUNDS]


def table(system: bool = True) -> pl.DataFrame:
    """test_objective's run table (evaluated 0.5, 0.7, 0.6; 0.4 GiB), on the clock of ROUNDS."""
    if not system:
        return plain_table()
    hours = [r["time/sim_elapsed_s"] for r in ROUNDS]
    return plain_table().with_columns(pl.Series("time/sim_elapsed_s", hours))


def test_running_objective_on_the_simulated_clock() -> None:
    # best within 1 simulated hour: 0.5 (round 2), frozen once past it
    assert feed(Objective(reduce="at_time_budget", budget_h=1.0)) == [None, 0.5, 0.5, 0.5]
    assert feed(Objective(reduce="at_time_budget", budget_h=0.4)) == [None, 0.0, 0.0, 0.0]
    # hours so far until the target is reached (a lower bound), then the hours it took
    assert feed(Objective(reduce="time_to_target", target=0.65)) == [None, 0.5, 1.25, 1.25]
    assert feed(Objective(reduce="time_to_target", target=0.9)) == [None, 0.5, 1.25, 2.0]
    with pytest.raises(ValueError, match=r"no time/sim_elapsed_s.*`system` section"):
        Intermediate(Objective(reduce="time_to_target", target=0.5), LAST_K).update(
            {"global/accuracy": 0.5}
        )


@pytest.mark.parametrize(
    ("objective", "value", "note"),
    [
        (Objective(reduce="at_time_budget", budget_h=1.0), 0.5, None),
        (Objective(reduce="at_time_budget", budget_h=2.0), 0.7, None),  # best, not last
        (Objective(reduce="at_time_budget", budget_h=0.25), 0.0, "no evaluation within 0.25"),
        (Objective(reduce="time_to_target", target=0.65), 1.25, None),
        (Objective(reduce="time_to_target", target=0.5), 0.5, None),
        (
            Objective(reduce="time_to_target", target=0.8, penalty_h=10.0),
            10.0,
            "target 0.8 not reached: counted penalty_h = 10 h",
        ),
    ],
)
def test_score_on_the_simulated_clock(objective: Objective, value: float, note: str | None) -> None:
    got, gib, details = score(table(), objective, last_k=LAST_K)
    assert got == pytest.approx(value) and gib == pytest.approx(0.4)
    assert details.get("note") == note if note is None else note in details["note"]
    assert details["sim_elapsed_h"] == pytest.approx(2.0)


def test_a_missed_target_without_penalty_prunes_the_trial() -> None:
    objective = Objective(reduce="time_to_target", target=0.8)
    with pytest.raises(TargetMissed, match=r"seed 3 never reached global/accuracy >= 0.8 in 4"):
        score(table(), objective, seed=3, last_k=LAST_K)


def test_a_run_without_simulated_time_cannot_be_scored_on_it() -> None:
    for objective in (
        Objective(reduce="at_time_budget", budget_h=1.0),
        Objective(reduce="time_to_target", target=0.5, penalty_h=3.0),
    ):
        with pytest.raises(ValueError, match=r"did not record.*`system` section"):
            score(table(system=False), objective, last_k=LAST_K)
    assert "sim_elapsed_h" not in score(table(system=False), Objective(), last_k=LAST_K)[2]


def test_names_labels_and_directions() -> None:
    at = Objective(reduce="at_time_budget", budget_h=1.5, kind="multi")
    assert at.names == ["at_1.5h:global/accuracy", "comm/total_gib"]
    assert at.directions == ["maximize", "minimize"]
    assert at.label == "Best global accuracy within 1.5 simulated hours"
    to = Objective(reduce="time_to_target", target=0.8, metric="local/accuracy")
    assert to.names == ["sim_hours_to_0.8:local/accuracy"] and to.directions == ["minimize"]
    assert to.label == "Simulated hours to 80% local accuracy"
    assert (to.shown(1.25), Objective().shown(0.5)) == ("1.25 h", "50.00%")


@pytest.mark.parametrize(
    ("objective", "message"),
    [
        ({"reduce": "at_time_budget"}, "reduce: at_time_budget needs budget_h"),
        ({"reduce": "time_to_target"}, "reduce: time_to_target needs target"),
        ({"reduce": "time_to_target", "target": 1.5}, "less than or equal to 1"),
        ({"reduce": "at_time_budget", "budget_h": 0}, "greater than 0"),
        ({"reduce": "final", "budget_h": 1.0}, "budget_h is only read with reduce: at_time_budget"),
        (
            {"reduce": "at_time_budget", "budget_h": 1.0, "penalty_h": 2.0},
            "penalty_h is only read with reduce: time_to_target",
        ),
        (
            {"reduce": "time_to_target", "target": 0.5, "kind": "multi"},
            "time_to_target is a single objective",
        ),
        (
            {"reduce": "time_to_target", "target": 0.5, "penalty_h": -1},
            "greater than 0",
        ),
    ],
)
def test_bad_objectives_are_named(objective: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Objective.model_validate(objective)


def test_space_files_check_the_objective_and_the_base_system(tmp_path: Path) -> None:
    ok = space_with({"type": "float", "low": 1e-6, "high": 1e-3, "log": True})
    missing = {**ok, "objective": {"reduce": "time_to_target"}}
    with pytest.raises(ConfigError, match=r"objective: .*reduce: time_to_target needs target"):
        load_sweep(write(tmp_path, missing), tmp_path)
    timed = {**ok, "objective": {"reduce": "at_time_budget", "budget_h": 2}}
    with pytest.raises(
        ConfigError,
        match=r"objective.reduce='at_time_budget' reads the simulated clock, but base.yaml has "
        r"no `train.system` section",
    ):
        load_sweep(write(tmp_path, timed), tmp_path)


def test_a_base_with_a_system_section_takes_the_time_objectives(tmp_path: Path) -> None:
    ok = space_with({"type": "float", "low": 1e-6, "high": 1e-3, "log": True})
    base = tiny_params(**{"algorithms.fedsparse": {"name": "fedsparse"}, "train.system": {}})
    timed = {**ok, "objective": {"reduce": "time_to_target", "target": 0.8, "penalty_h": 5}}
    sweep, _ = load_sweep(write(tmp_path, timed, base), tmp_path)
    assert sweep.objective.directions == ["minimize"]


def _sweep(objective: dict[str, Any]) -> Sweep:
    return Sweep.model_validate(
        {
            "study": "s",
            "base": "b.yaml",
            "run": "r",
            "trials": 3,
            "objective": objective,
            "space": {"x": {"type": "float", "low": 0, "high": 1}},
        }
    )


def test_fewer_hours_win_the_front_and_the_top_trials() -> None:
    sweep = _sweep({"reduce": "time_to_target", "target": 0.8, "penalty_h": 9})
    name = f"value:{sweep.objective.names[0]}"
    frame = pl.DataFrame(
        {
            "number": [0, 1, 2],
            "state": ["COMPLETE"] * 3,
            name: [1.0, 2.0, 3.0],
            "total_gib": [0.5, 0.4, 0.6],
            "pareto": [True, True, False],
        }
    )
    # trial 2 is slower and costlier than trial 0: dominated; trial 1 sent less
    assert pareto_mask(frame, sweep).to_list() == [True, True, False]
    text = render_summary(frame, sweep, None, last_k=LAST_K)
    top = text.split("## Top trials")[1].splitlines()[4:7]
    assert [line.split(" | ")[0] for line in top] == ["| 0", "| 1", "| 2"]
    assert "| 0 | 1 h |" in text and "(minimize)" in text
    assert "## Pareto front (simulated hours down, GiB down)" in text
