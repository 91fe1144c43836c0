"""`fedcomm config validate` checks everything that can be known without training: the dataset
loads, the partition can be drawn, each run's model fits the data and its algorithm accepts the
model. Configs the stages would reject are rejected here, naming the key; nothing is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from fedcomm.cli import app
from tests.conftest import tiny_params

CASES: dict[str, tuple[dict[str, Any], str]] = {
    "lstm_on_digits": ({"model": {"name": "lstm"}}, "error: model: 'lstm' does not fit"),
    "feddrop_on_resnet20": (
        {"model": {"name": "resnet20"}, "algorithms.fedavg": {"name": "feddrop", "fc_rate": 0.5}},
        "error: algorithms.fedavg: feddrop supports the sequential models",
    ),
    "5000_clients_on_digits": (
        {"partition.num_partitions": 5000},
        "error: partition.num_partitions: must be an integer in [1, 1797], got 5000",
    ),
    "fit_deadline_on_fedsparse": (
        {
            "algorithms.fedavg": {"name": "fedsparse"},
            "train.system": {
                "policy": {
                    "deadline_s": 10,
                    "compression": {"kind": "fit_deadline", "ladder": [0.1]},
                }
            },
        },
        "error: algorithms.fedavg: train.system.policy.compression: fit_deadline",
    ),
    "bogus_data_root": (
        {"data.root": "/nonexistent/fedcomm-data", "data.dataset": {"name": "mnist"}},
        "set data.root in params.yaml",
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_validate_rejects_what_the_stages_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    monkeypatch.chdir(tmp_path)
    overrides, expected = CASES[case]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params(**overrides)))
    res = CliRunner().invoke(app, ["config", "validate"])
    assert res.exit_code == 2 and expected in res.output and "Traceback" not in res.output, (
        res.output
    )
    schema = CliRunner().invoke(app, ["config", "validate", "--schema-only"])
    assert schema.exit_code == 0, schema.output  # the schema alone cannot know these
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]  # nothing written


def test_validate_ok_names_the_clients(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params()))
    res = CliRunner().invoke(app, ["config", "validate"])
    assert res.exit_code == 0 and ", 8 clients," in res.output, res.output
