"""Trial scoring: the running objective the pruner sees, the final score, the Pareto mask."""

from __future__ import annotations

import polars as pl
import pytest

from fedcomm.comm.bits import GIB
from fedcomm.evaluation.curve_points import LAST_K
from fedcomm.sweep.outputs import pareto_mask
from fedcomm.sweep.space import Objective, Sweep
from fedcomm.sweep.trial import Intermediate, score

ROUNDS = [
    {"global/accuracy": None, "comm/cum_gib": 0.1},
    {"global/accuracy": 0.5, "comm/cum_gib": 0.2},
    {"global/accuracy": 0.7, "comm/cum_gib": 0.3},
    {"global/accuracy": 0.6, "comm/cum_gib": 0.4},
]


def feed(objective: Objective, last_k: int = 5) -> list[float | None]:
    running = Intermediate(objective, last_k)
    return [running.update(m) for m in ROUNDS]


def test_running_objective_final_best_and_at_budget() -> None:
    # final: the mean of the last k evaluations so far (every fedcomm table's meaning)
    assert feed(Objective(reduce="final")) == pytest.approx([None, 0.5, 0.6, 0.6])
    assert feed(Objective(reduce="final"), last_k=2) == pytest.approx([None, 0.5, 0.6, 0.65])
    assert feed(Objective(reduce="final"), last_k=1) == [None, 0.5, 0.7, 0.6]
    assert feed(Objective(reduce="best")) == [None, 0.5, 0.7, 0.7]
    # past the budget the value is frozen at the best within it
    assert feed(Objective(reduce="at_budget", budget_gib=0.25)) == [None, 0.5, 0.5, 0.5]
    # a first evaluation already over budget scores 0
    assert feed(Objective(reduce="at_budget", budget_gib=0.15)) == [None, 0.0, 0.0, 0.0]


def table() -> pl.DataFrame:
    return pl.DataFrame(
        {
            "round": [1, 2, 3, 4],
            "global/accuracy": [None, 0.5, 0.7, 0.6],
            "local/accuracy": [0.4, 0.45, 0.5, 0.55],
            "model/sparsity": [0.0, 0.1, 0.2, 0.3],
            "cum_gib": [0.1, 0.2, 0.3, 0.4],
            "cum_up_bytes": [x * GIB for x in (0.04, 0.08, 0.12, 0.16)],
        }
    )


@pytest.mark.parametrize(
    ("objective", "acc", "gib"),
    [
        (Objective(reduce="final"), 0.6, 0.4),
        (Objective(reduce="best"), 0.7, 0.4),
        (Objective(reduce="at_budget", budget_gib=0.25), 0.5, 0.4),
        (Objective(metric="local/accuracy", kind="multi", comm="up"), 0.475, 0.16),
    ],
)
def test_score_reads_the_run_table(objective: Objective, acc: float, gib: float) -> None:
    got_acc, got_gib, details = score(table(), objective, last_k=LAST_K)
    assert got_acc == pytest.approx(acc) and got_gib == pytest.approx(gib)
    assert details["sparsity"] == pytest.approx(0.3)
    assert details["best_global_accuracy"] == pytest.approx(0.7)


def test_score_at_an_unreachable_budget_is_zero_with_a_note() -> None:
    acc, _, details = score(table(), Objective(reduce="at_budget", budget_gib=0.05), last_k=LAST_K)
    assert acc == 0.0 and "no evaluation within 0.05 GiB" in details["note"]


def test_pareto_mask_marks_exactly_the_non_dominated_complete_trials() -> None:
    sweep = Sweep.model_validate(
        {
            "base": "b.yaml",
            "run": "r",
            "trials": 5,
            "objective": {"kind": "multi"},
            "space": {"x": {"type": "float", "low": 0, "high": 1}},
        }
    )
    acc = "value:final:global/accuracy"
    frame = pl.DataFrame(
        {
            "state": ["COMPLETE", "COMPLETE", "COMPLETE", "COMPLETE", "PRUNED", "COMPLETE"],
            acc: [0.9, 0.8, 0.8, 0.95, 0.99, 0.7],
            "total_gib": [1.0, 0.5, 0.6, 2.0, 0.1, 0.5],
        }
    )
    # (0.8, 0.6) is dominated by (0.8, 0.5); (0.7, 0.5) by (0.8, 0.5); pruned never on the front
    assert pareto_mask(frame, sweep).to_list() == [True, True, False, True, False, False]


def test_the_sweep_legend_never_covers_a_point() -> None:
    from matplotlib.figure import Figure

    from fedcomm.sweep.outputs import legend_outside

    fig = Figure(figsize=(7.5, 4.8), layout="tight")
    ax = fig.subplots()
    xs = [i / 10 for i in range(11)]
    ax.scatter(xs, xs, label="trials")  # points up to every corner, the lower right included
    ax.scatter([1.0], [0.0], label="Pareto front")
    legend_outside(ax)
    fig.canvas.draw()  # type: ignore[no-untyped-call]
    legend = ax.get_legend()
    assert legend is not None
    box, axes = legend.get_window_extent(), ax.get_window_extent()
    assert box.x0 >= axes.x1  # wholly right of the plotting area
