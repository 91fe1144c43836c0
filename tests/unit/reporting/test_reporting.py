"""Tests of the report: plots are real PNGs, the markdown carries the numbers as specified."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from fedcomm.reporting import (
    plot_accuracy_vs_gib,
    plot_accuracy_vs_round,
    render_markdown,
    summary_table,
    write_report,
)
from fedcomm.reporting.plots import algorithm_styles, seed_curve
from fedcomm.reporting.summary import format_value

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def fake_rounds(
    rounds: int, gib_per_round: float, ceiling: float, seed: int, eval_every: int = 1
) -> pl.DataFrame:
    """A rounds table whose accuracy rises towards ``ceiling``; evaluated every few rounds."""
    r = list(range(1, rounds + 1))
    acc = [ceiling * (1 - math.exp(-i / 8)) + 0.01 * ((i * (seed + 3)) % 5 - 2) for i in r]
    evaluated = [i % eval_every == 0 or i == rounds for i in r]
    return pl.DataFrame(
        {
            "round": r,
            "global/accuracy": [a if e else None for a, e in zip(acc, evaluated, strict=True)],
            "local/accuracy": [
                min(a + 0.1, 1.0) if e else None for a, e in zip(acc, evaluated, strict=False)
            ],
            "comm/cum_gib": [gib_per_round * i for i in r],
        },
        schema_overrides={"round": pl.Int32},
    )


def fake_summary(global_acc: float, local_acc: float, up: float, down: float) -> dict:
    return {
        "final": {
            "global/accuracy": global_acc,
            "local/accuracy": local_acc,
            "comm/up_gib": up,
            "comm/down_gib": down,
            "comm/cum_gib": up + down,
            "model/sparsity": 0.25,
        },
        "best": {"global/accuracy": global_acc + 0.01, "local/accuracy": local_acc},
    }


ROUNDS = {
    "fedavg": [fake_rounds(40, 0.05, 0.9, 0), fake_rounds(40, 0.05, 0.88, 1)],
    # second seed stopped early and was evaluated every 5 rounds: aligned on common rounds
    "fedsparse": [fake_rounds(40, 0.01, 0.86, 0), fake_rounds(30, 0.012, 0.85, 1, 5)],
}
SUMMARIES = {
    "fedavg": [fake_summary(0.90, 0.95, 1.0, 1.0), fake_summary(0.88, 0.93, 1.0, 1.0)],
    "fedsparse": [fake_summary(0.86, 0.91, 0.123456, 0.4), fake_summary(0.86, 0.91, 0.123456, 0.4)],
}


def _assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 20_000  # a blank 1125x720 PNG is a few KB; curves, text and bands add more


def test_write_report_writes_pngs_and_markdown(tmp_path: Path) -> None:
    written = write_report(tmp_path, ROUNDS, SUMMARIES, title="Digits, 2 algorithms", last_k=5)
    plots = tmp_path / "plots"
    names = ["global_accuracy_vs_gib.png", "local_accuracy_vs_gib.png", "accuracy_vs_round.png"]
    assert written == [*(plots / n for n in names), tmp_path / "summary.md"]
    for png in written[:3]:
        _assert_png(png)
    assert not [p for p in tmp_path.rglob("*.tmp")]  # no temp files left behind
    md = (tmp_path / "summary.md").read_text()
    assert md.startswith("# Digits, 2 algorithms\n")
    assert "`fedavg`" in md and "`fedsparse`" in md
    # fedavg final global: mean 89.00 %, se = std(0.90, 0.88) / sqrt 2 = 0.01 -> 1.00 %
    assert "89.00 ± 1.00" in md
    # fedsparse up GiB: 4 significant digits, identical seeds -> se 0
    assert "0.1235 ± 0.000" in md
    assert "25.00 ± 0.00" in md  # sparsity in percent
    for n in names:
        assert f"](plots/{n})" in md


def test_summary_table_numeric_mean_and_se() -> None:
    table = summary_table(SUMMARIES)
    assert table["algorithm"].to_list() == ["fedavg", "fedsparse"]
    assert table["seeds"].to_list() == [2, 2]
    row = table.row(0, named=True)
    assert row["final_global_acc_mean"] == pytest.approx(0.89)
    assert row["final_global_acc_se"] == pytest.approx(0.01)
    assert row["total_gib_mean"] == pytest.approx(2.0)
    assert row["best_local_acc_mean"] == pytest.approx(0.94)


def test_render_markdown_single_seed_and_missing_values() -> None:
    table = summary_table({"fedavg": [{"final": {"global/accuracy": 0.5, "comm/cum_gib": 12.0}}]})
    md = render_markdown(
        table, title="T", plots=[("Curve", "plots/c.png")], notes=["seed 0"], last_k=5
    )
    assert "| `fedavg` | 1 | 50.00 | – |" in md  # one seed: no ± part; unmeasured: dash
    assert "| 12.00 |" in md
    assert "![Curve](plots/c.png)" in md
    assert md.rstrip().endswith("- seed 0")


def test_format_value() -> None:
    assert format_value(0.91234, 0.00456, "percent", seeds=3) == "91.23 ± 0.46"
    assert format_value(1234.5678, 0.012346, "gib", seeds=3) == "1235 ± 0.01235"
    assert format_value(12.0, 0.5, "gib", seeds=2) == "12.00 ± 0.5000"  # trailing zeros kept
    assert format_value(None, None, "gib", seeds=3) == "–"


def test_seed_curve_aligns_on_common_rounds() -> None:
    a = pl.DataFrame({"round": [1, 2, 3], "m": [0.1, 0.2, 0.3], "x": [1.0, 2.0, 3.0]})
    b = pl.DataFrame({"round": [1, 2, 3], "m": [0.3, None, 0.5], "x": [1.0, 2.0, 5.0]})
    curve = seed_curve([a, b], "m", "x")
    assert curve.x == [1.0, 4.0]  # round 2 not measured by b; x is the seeds' mean
    assert curve.mean == pytest.approx([0.2, 0.4])
    assert curve.se == pytest.approx([0.1, 0.1])  # std of (0.1, 0.3) / sqrt 2
    assert curve.seeds == 2


def test_colours_consistent_across_label_order() -> None:
    assert algorithm_styles(["b", "a"]) == algorithm_styles(["a", "b", "a"])
    assert len({c for c, _ in algorithm_styles(["a", "b", "c"]).values()}) == 3
    many = algorithm_styles([f"run{i}" for i in range(40)])  # a 12-run reproduction and more
    assert len(set(many.values())) == 40  # no two runs share colour and marker


def test_plots_without_the_metric_still_write_a_png(tmp_path: Path) -> None:
    runs = {"fedavg": [fake_rounds(5, 0.1, 0.9, 0).drop("local/accuracy")]}
    plot_accuracy_vs_gib(runs, tmp_path / "local.png", metric="local/accuracy")
    plot_accuracy_vs_round(runs, tmp_path / "round.png")
    assert (tmp_path / "local.png").read_bytes()[:8] == PNG_MAGIC
    _assert_png(tmp_path / "round.png")
