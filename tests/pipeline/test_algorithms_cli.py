"""Every algorithm of the FedSparse issue runs from params through `fedcomm train` and
`fedcomm evaluate`, and logs its metrics to MLflow (the DVC matrix calls the same commands)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from typer.testing import CliRunner

from fedcomm.cli import app
from tests.conftest import tiny_params

pytestmark = pytest.mark.slow

RUNS = {
    "fedsparse": (
        {"name": "fedsparse", "lambda0": 1e-3},
        ["fedsparse/tv_mean", "fedsparse/tv_max", "model/density"],
    ),
    "feddrop": ({"name": "feddrop", "fc_rate": 0.5}, ["feddrop/submodel_fraction"]),
    "fedl1": ({"name": "fedl1", "threshold": 0.05}, ["fedl1/kept_groups"]),
    "fedavg_laplace": ({"name": "fedavg_laplace", "lam": 1e-3}, []),
    "fedavg_mog": ({"name": "fedavg_mog", "components": 2}, ["global/member1/accuracy"]),
}
COMMON = ["global/accuracy", "local/accuracy", "local/coverage", "comm/cum_gib", "model/sparsity"]


def test_all_algorithms_train_evaluate_and_log(project: Path) -> None:
    raw = tiny_params(**{"experiment.runs": list(RUNS), "train.rounds": 3})
    raw["algorithms"] = {name: cfg for name, (cfg, _) in RUNS.items()}
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    cli = CliRunner()
    assert cli.invoke(app, ["partition"]).exit_code == 0
    for run in RUNS:
        res = cli.invoke(app, ["train", "--run", run])
        assert res.exit_code == 0, (run, res.output, res.exception)
        res = cli.invoke(app, ["evaluate", "--run", run])
        assert res.exit_code == 0, (run, res.output, res.exception)
    res = cli.invoke(app, ["summarize"])
    assert res.exit_code == 0, res.output
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tests")
    assert exp is not None
    for run, (_, keys) in RUNS.items():
        found = client.search_runs([exp.experiment_id], f"attributes.run_name = '{run}-s0'")
        assert len(found) == 1 and found[0].info.status == "FINISHED"
        logged = found[0].data.metrics
        for key in [*COMMON, *keys]:
            assert key in logged, (run, key)
        assert "summary/final.global/accuracy" in logged
    summary = (project / "reports" / "summary.md").read_text()
    assert all(f"`{run}`" in summary for run in RUNS)


def test_dropout_algorithms_with_dgc_run_from_params(project: Path) -> None:
    """FedBIAD+DGC, AFD+DGC, FjORD+DGC: a per-run ``uplink`` compressor on top of the dropout."""
    import polars as pl

    dgc = {"name": "dgc", "density": 0.01, "warmup_rounds": 0}
    algorithms = {
        "fedbiad_dgc": {"name": "fedbiad", "p": 0.2, "uplink": dgc},
        "afd_dgc": {"name": "afd", "p": 0.2, "uplink": dgc},
        "fjord_dgc": {"name": "fjord", "q_max": 0.8, "uplink": dgc},
        "fedbiad": {"name": "fedbiad", "p": 0.2},
    }
    raw = tiny_params(**{"experiment.runs": list(algorithms), "train.rounds": 2})
    raw["algorithms"] = algorithms
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    cli = CliRunner()
    assert cli.invoke(app, ["partition"]).exit_code == 0
    up_bits = {}
    for run in algorithms:
        res = cli.invoke(app, ["train", "--run", run])
        assert res.exit_code == 0, (run, res.output, res.exception)
        ledger = pl.read_parquet(project / "runs" / f"{run}-s0" / "train" / "ledger.parquet")
        up = ledger.filter(pl.col("direction") == "up")
        up_bits[run] = int((up["payload_bits"] + up["index_bits"] + up["meta_bits"]).sum())
        if run.endswith("_dgc"):
            assert int(up["index_bits"].sum()) > 0  # DGC positions, 64 bits each
    assert up_bits["fedbiad_dgc"] < up_bits["fedbiad"] / 5
