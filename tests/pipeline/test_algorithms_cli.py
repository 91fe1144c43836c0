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


def test_feddst_family_on_lotteryfl_shards_with_upload_caps(project: Path) -> None:
    """FedDST, RandomMask, GraSP and PruneFL from params on LotteryFL shards; the upload-cap
    table (FedDST's Tables 1-3) in each run's metrics and in the report."""
    import json

    algorithms = {
        "fedavgm": {"name": "fedavg"},
        "feddst": {"name": "feddst", "sparsity": 0.5, "alpha": 0.2, "readjust_every": 2},
        "randommask": {"name": "randommask", "sparsity": 0.5},
        "grasp": {"name": "grasp", "sparsity": 0.5},
        "prunefl": {"name": "prunefl", "initial_rounds": 2, "readjust_every": 2},
    }
    raw = tiny_params(
        **{
            "experiment.runs": list(algorithms),
            "train.rounds": 4,
            "train.local": {"epochs": 2, "batch_size": 16, "lr": 0.05, "momentum": 0.9},
            "partition": {"kind": "lotteryfl", "num_partitions": 8, "test_per_class": 10},
            "evaluate.upload_caps_gib": [1e-4, 1.0],
        }
    )
    raw["algorithms"] = algorithms
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    cli = CliRunner()
    assert cli.invoke(app, ["partition"]).exit_code == 0
    for run in algorithms:
        for stage in ("train", "evaluate"):
            res = cli.invoke(app, [stage, "--run", run])
            assert res.exit_code == 0, (run, stage, res.output, res.exception)
    assert cli.invoke(app, ["summarize"]).exit_code == 0
    caps = {
        run: json.loads((project / "runs" / f"{run}-s0" / "metrics.json").read_text())[
            "at_upload_cap"
        ]
        for run in algorithms
    }
    assert all(c["1"] is not None for c in caps.values())  # 1 GiB: every evaluation counts
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tests")
    assert exp is not None
    keys = {
        "feddst": ["feddst/mask_churn", "feddst/density"],
        "randommask": ["randommask/mask_churn"],
        "grasp": ["grasp/density"],
        "prunefl": ["prunefl/mask_density"],
    }
    for run, wanted in keys.items():
        (found,) = client.search_runs([exp.experiment_id], f"attributes.run_name = '{run}-s0'")
        for key in [*wanted, "comm/cum_up_bytes", "comm/up_ratio", "summary/at_upload_cap.1"]:
            assert key in found.data.metrics, (run, key)
    ratios = {
        run: client.search_runs([exp.experiment_id], f"attributes.run_name = '{run}-s0'")[
            0
        ].data.metrics["comm/up_ratio"]
        for run in ("fedavgm", "randommask")
    }
    assert ratios["fedavgm"] == 1.0 and ratios["randommask"] > 1.5  # half the weights sent
    summary = (project / "reports" / "summary.md").read_text()
    assert "within an upload cap" in summary and "≤ 0.0001 GiB" in summary
