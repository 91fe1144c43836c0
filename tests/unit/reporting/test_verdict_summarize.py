"""The summarize stage's decision rule: ``summarize.paired`` and ``evaluate.last_k`` validated at
the boundary, final accuracy = the mean of the last k evaluations, and the "Paired comparisons
over seeds (decision rule)" section with its numbers in reports/summary.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml

from fedcomm.comm.ledger import SCHEMA as LEDGER_SCHEMA
from fedcomm.config import ConfigError, load_params, validate_params
from fedcomm.evaluation.summaries import summarize_run
from fedcomm.reporting.sections import PairedRow, paired_section
from fedcomm.reporting.summary import render_markdown, summary_table
from fedcomm.reporting.verdict import paired
from fedcomm.stages.evaluate import evaluate_stage
from fedcomm.stages.partition import partition_stage
from fedcomm.stages.summarize import summarize_stage
from fedcomm.stages.train import train_stage
from tests.conftest import tiny_params


@pytest.mark.parametrize(
    ("paired_cfg", "expected"),
    [
        ({"a": "fedavg", "b": "nope"}, "summarize.paired[0].b='nope' is not a run of"),
        (
            {"a": "fedavg", "b": "fedprox", "metric": "accuracy"},
            "summarize.paired.0.metric: 'accuracy' is not a curve column",
        ),
        ({"a": "fedavg", "b": "fedavg"}, "summarize.paired.0: a and b are the same run"),
        ({"a": "fedavg", "b": "fedprox", "side": "up"}, "summarize.paired.0.side: Extra inputs"),
    ],
)
def test_paired_params_are_checked_at_the_boundary(
    paired_cfg: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ConfigError, match="summarize") as err:
        validate_params(tiny_params(**{"summarize.paired": [paired_cfg]}))
    assert expected in str(err.value)
    with pytest.raises(ConfigError, match=r"evaluate\.last_k"):
        validate_params(tiny_params(**{"evaluate.last_k": 0}))


def test_the_old_summarize_last_k_key_names_its_new_place() -> None:
    with pytest.raises(ConfigError) as err:
        validate_params(tiny_params(**{"summarize.last_k": 3}))
    assert "last_k moved to evaluate.last_k" in str(err.value)
    assert "evaluate.last_k: 3" in str(err.value)


def test_scale_defaults_to_points_for_accuracies() -> None:
    p = validate_params(
        tiny_params(
            **{
                "summarize.paired": [
                    {"a": "fedavg", "b": "fedprox"},
                    {"a": "fedavg", "b": "fedprox", "metric": "cum_gib"},
                ]
            }
        )
    )
    assert [c.shown_scale for c in p.summarize.paired] == [100.0, 1.0]
    assert p.evaluate.last_k == 5


def test_final_accuracy_is_the_mean_of_the_last_k_evaluations() -> None:
    rounds = pl.DataFrame(
        {
            "round": [4, 1, 2, 3],
            "global/accuracy": [0.8, 0.2, None, 0.6],
            "local/accuracy": [0.5, 0.1, 0.2, 0.3],
        }
    )
    rounds = rounds.with_columns(
        pl.Series("model/sparsity", [0.4, 0.1, 0.2, 0.3]),
        pl.Series("comm/up_bytes", [4.0, 1.0, 2.0, 3.0]),
    )
    ledger = pl.DataFrame(schema=LEDGER_SCHEMA)
    clients = pl.DataFrame(schema={"round": pl.Int32, "client_id": pl.Int32, "train_s": pl.Float64})
    out = summarize_run(rounds, ledger, clients, last_k=2)
    assert out["final"]["global/accuracy"] == pytest.approx(0.7)  # rounds 3 and 4
    assert out["final"]["local/accuracy"] == pytest.approx(0.4)
    assert out["final"]["model/sparsity"] == 0.4  # a state keeps the last round's value
    last = summarize_run(rounds, ledger, clients, last_k=1)
    assert last["final"]["global/accuracy"] == 0.8
    text = render_markdown(summary_table({"r": [out]}), title="t", plots=[], last_k=2)
    assert "final accuracy = mean of each seed's last 2 evaluations" in text
    assert "| 70.00 |" in text


def test_paired_section_renders_n_mean_se_t_df_critical_and_verdict() -> None:
    result = paired({0: 0.91, 1: 0.92, 2: 0.95}, {0: 0.90, 1: 0.90, 2: 0.92}, scale=100.0)
    text = paired_section([PairedRow("new", "old", "global_accuracy", 100.0, result)], 5)
    assert text.startswith("## Paired comparisons over seeds (decision rule)")
    assert "last 5 evaluations" in text
    row = text.splitlines()[-1]
    assert row == (
        "| `new` | `old` | global_accuracy | a − b > 0 (points) | 3 | +2.00 ± 0.58 | 3.46 | 2 "
        "| 2.920 | **reproduced** |"
    )


def test_summarize_stage_decides_the_paired_comparisons(project: Path) -> None:
    raw = tiny_params(
        **{
            "tracking.enabled": False,
            "experiment.seeds": [0, 1, 2],
            "evaluate.last_k": 2,
            "summarize.paired": [
                {"a": "fedprox", "b": "fedavg", "margin": -50.0},
                {"a": "fedprox", "b": "fedavg", "metric": "local_accuracy", "direction": "less"},
            ],
        }
    )
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    params = load_params(project / "params.yaml")
    partition_stage(params)
    for run in params.experiment.runs:
        for seed in params.experiment.seeds:
            train_stage(params, run, seed, show_progress=False)
            evaluate_stage(params, run, seed)
    summarize_stage(params)

    def final(run: str, seed: int, column: str) -> float:
        t = pl.read_parquet(project / "runs" / f"{run}-s{seed}" / "train" / "rounds.parquet")
        return float(t.sort("round")[column].drop_nulls().tail(2).mean())  # type: ignore[arg-type]

    d = [
        100 * (final("fedprox", s, "global/accuracy") - final("fedavg", s, "global/accuracy"))
        for s in range(3)
    ]
    mean = sum(d) / 3
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / 2) / math.sqrt(3)
    metrics = json.loads((project / "reports" / "summary.json").read_text())
    first, second = metrics["paired"]
    assert (first["a"], first["b"], first["n"], first["df"], first["last_k"]) == (
        "fedprox",
        "fedavg",
        3,
        2,
        2,
    )
    assert first["d"] == pytest.approx(d) and first["mean"] == pytest.approx(mean)
    assert first["se"] == pytest.approx(se)
    assert first["verdict"] == "reproduced"  # within 50 points: tiny runs differ by a few
    assert second["metric"] == "local_accuracy" and second["n"] == 3
    assert first["per_seed"]["a"]["1"] == pytest.approx(final("fedprox", 1, "global/accuracy"))
    expected_final = sum(final("fedavg", s, "global/accuracy") for s in range(3)) / 3
    assert metrics["fedavg"]["final"]["global/accuracy"] == pytest.approx(expected_final)
    summary = (project / "reports" / "summary.md").read_text()
    assert "## Paired comparisons over seeds (decision rule)" in summary
    assert "final accuracy = mean of each seed's last 2 evaluations" in summary
    assert "| `fedprox` | `fedavg` | global_accuracy | a − b > -50 (points) | 3 |" in summary
    curves = pl.read_csv(project / "reports" / "curves.csv")
    assert curves.columns[:3] == ["run", "seed", "round"] and "model_sparsity" in curves.columns
