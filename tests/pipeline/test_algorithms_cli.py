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
        run: json.loads((project / "runs" / f"{run}-s0" / "summary.json").read_text())[
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


def test_progfed_with_lq_and_sp_uplinks_runs_from_params(project: Path) -> None:
    """ProgFed (S = 2, one warm-up round) and its end-to-end baseline with LQ-8, LQ-2, SP-10 and
    LQ8+SP10 uplinks: ``fedcomm train/evaluate/summarize``, stage metrics in MLflow, the
    warm-up round run on top of ``train.rounds``, the cost ratio in summary.json."""
    import json

    import polars as pl

    algorithms = {
        "e2e": {"name": "progfed", "stages": 1},
        "progfed": {"name": "progfed", "stages": 2, "warmup_rounds": 1},
        "progfed_lq8": {"name": "progfed", "stages": 2, "uplink": {"name": "lq", "bits": 8}},
        "e2e_lq2": {"name": "progfed", "stages": 1, "uplink": {"name": "lq", "bits": 2}},
        "progfed_sp10": {"name": "progfed", "stages": 2, "uplink": {"name": "sp", "keep": 0.1}},
        "progfed_lq8sp10": {
            "name": "progfed",
            "stages": 2,
            "uplink": {"name": "sp", "keep": 0.1, "bits": 8},
        },
    }
    raw = tiny_params(
        **{
            "experiment.runs": list(algorithms),
            "train.rounds": 4,
            "train.local": {"epochs": 1, "batch_size": 16, "lr": 0.1, "momentum": 0.9},
            "model": {"name": "mnist_cnn", "channels": [4, 8], "hidden": 16},
        }
    )
    raw["algorithms"] = algorithms
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    cli = CliRunner()
    res = cli.invoke(app, ["partition"])
    assert res.exit_code == 0, res.output
    for run in algorithms:
        for stage in ("train", "evaluate"):
            res = cli.invoke(app, [stage, "--run", run])
            assert res.exit_code == 0, (run, stage, res.output, res.exception)
    assert cli.invoke(app, ["summarize"]).exit_code == 0
    rounds = pl.read_parquet(project / "runs" / "progfed-s0" / "train" / "rounds.parquet")
    assert rounds["round"].to_list() == [1, 2, 3, 4, 5]  # T = 4 plus one warm-up round
    # T_s = T/(2S) = 1 round of stage 1, the warm-up round, then T − T_s = 3 of the full model
    assert rounds["progfed/stage"].to_list() == [1, 2, 2, 2, 2]
    assert rounds["progfed/warmup"].to_list() == [0, 1, 0, 0, 0]
    metrics = {
        run: json.loads((project / "runs" / f"{run}-s0" / "summary.json").read_text())
        for run in algorithms
    }
    cost = {run: m["comm"]["cost_vs_dense_e2e"] for run, m in metrics.items()}
    assert cost["e2e"] == pytest.approx(1.0)  # the baseline is dense end-to-end by definition
    # ProgFed's cost from the sub-model sizes: round 1 sends M^1 both ways, the warm-up round
    # M^2 down and E_2 + G_2 up, then M^2 both ways for 3 rounds; over 4 dense rounds
    import torch

    from fedcomm.models import build_model
    from fedcomm.models.progressive import ProgressiveNet

    base = build_model(
        "mnist_cnn", input_shape=(1, 8, 8), num_classes=10, channels=[4, 8], hidden=16
    )
    net = ProgressiveNet(base, 2, 10, torch.Generator().manual_seed(0))
    p1, p2 = net.submodel_numel(1), net.submodel_numel(2)
    new = sum(
        p.numel()
        for n, p in net.named_parameters()
        if n in [*net.block_params(2), *net.head_params(2)]
    )
    assert cost["progfed"] == pytest.approx((2 * p1 + p2 + new + 6 * p2) / (8 * p2))
    assert cost["progfed"] > 1.0  # at T = 4 the warm-up round costs more than stage 1 saves
    assert cost["e2e_lq2"] < cost["progfed_lq8"] < 0.65  # 2 (8) bits up, 32 down
    assert cost["progfed_lq8sp10"] < cost["progfed_sp10"] < cost["progfed_lq8"]
    up = {run: m["comm"]["up_cost_vs_dense_e2e"] for run, m in metrics.items()}
    assert up["e2e"] == pytest.approx(1.0)
    assert up["e2e_lq2"] == pytest.approx(2 / 32, abs=0.02)  # b/32 plus per-tensor metadata
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tests")
    assert exp is not None
    (found,) = client.search_runs([exp.experiment_id], "attributes.run_name = 'progfed-s0'")
    for key in (
        "progfed/stage",
        "progfed/submodel_params",
        "progfed/submodel_fraction",
        "comm/cost_vs_dense",
        "summary/comm.cost_vs_dense_e2e",
        "summary/saved_model.global/accuracy",
    ):
        assert key in found.data.metrics, key
    assert "All traffic vs dense end-to-end" in (project / "reports" / "summary.md").read_text()


def test_vectorized_backend_from_params_matches_sequential_and_is_tagged(
    project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``train.backend: vectorized`` through `fedcomm train`: the same final accuracy as the
    sequential run of the same params (within float tolerance), the backend that ran as an
    MLflow tag, and ProgFed's fallback to sequential named in the log and the tag."""
    import logging

    import polars as pl

    algorithms = {"feddst": {"name": "feddst", "readjust_every": 1}, "progfed": {"name": "progfed"}}
    finals: dict[str, dict[str, float]] = {}
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    cli = CliRunner()
    for backend in ("sequential", "vectorized"):
        raw = tiny_params(**{"experiment.runs": list(algorithms), "train.rounds": 4})
        raw["algorithms"] = algorithms
        raw["train"]["backend"] = backend
        raw["tracking"]["experiment"] = f"tests-{backend}"
        (project / "params.yaml").write_text(yaml.safe_dump(raw))
        assert cli.invoke(app, ["partition"]).exit_code == 0
        for run in algorithms:
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="fedcomm.backend"):
                res = cli.invoke(app, ["train", "--run", run, "--no-resume"])
            assert res.exit_code == 0, (run, res.output, res.exception)
            rounds = pl.read_parquet(project / "runs" / f"{run}-s0" / "train" / "rounds.parquet")
            finals.setdefault(run, {})[backend] = float(rounds["global/accuracy"][-1])
            exp = client.get_experiment_by_name(f"tests-{backend}")
            assert exp is not None
            found = client.search_runs([exp.experiment_id], f"attributes.run_name = '{run}-s0'")
            ran = "sequential" if run == "progfed" else backend
            assert found[0].data.tags["fedcomm.backend"] == ran
            fell_back = [r for r in caplog.records if "progfed runs sequentially" in r.getMessage()]
            assert bool(fell_back) == (run == "progfed" and backend == "vectorized")
    for run, by in finals.items():
        assert by["vectorized"] == pytest.approx(by["sequential"], abs=1e-6), run
