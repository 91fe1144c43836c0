"""Typed params: every bad key or value is rejected by name, before any work."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.config import ConfigError, load_params, validate_params
from tests.conftest import REPO, tiny_params


def _error(**overrides: object) -> str:
    with pytest.raises(ConfigError) as info:
        validate_params(tiny_params(**overrides))
    return str(info.value)


def test_repository_params_and_profiles_validate() -> None:
    pipeline = REPO / "pipeline"
    files = [
        *sorted((pipeline / "profiles").glob("*.yaml")),
        *sorted((pipeline / "reproductions").glob("*.yaml")),
    ]
    assert len(files) >= 3
    for path in [REPO / "params.yaml", *files]:
        load_params(path)


def test_tiny_params_validate() -> None:
    p = validate_params(tiny_params())
    assert p.algorithm("fedprox").name == "fedprox"
    assert p.train.local.lr == 0.05


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ({"train.local.lr": -1.0}, "train.local.lr: Input should be greater than 0 (got -1.0)"),
        ({"train.nproc": 0}, "train.nproc: Input should be greater than or equal to 1 (got 0)"),
        ({"train.rounds": 0}, "train.rounds"),
        ({"train.lr": 0.1}, "train.lr: Extra inputs are not permitted (got 0.1; allowed keys: "),
        (
            {"train.clients_per_round": 9},
            "train.clients_per_round=9 exceeds partition.num_partitions=8",
        ),
        ({"data.dataset": {"name": "cifar10", "label": "fine"}}, "allowed keys: name"),
        ({"partition.alpha": -0.5}, "partition.alpha: must be > 0 (got -0.5)"),
        ({"partition.kind": "random"}, "partition.kind: Input tag 'random' found using 'kind'"),
        (
            {"algorithms.fedprox.mu": -1},
            "algorithms.fedprox.mu: Input should be greater than or equal to 0 (got -1)",
        ),
        ({"algorithms.fedavg.name": "fedsgd"}, "algorithms.fedavg.name: Input tag 'fedsgd'"),
        (
            {"algorithms.fedavg.server": {"optimizer": "rmsprop"}},
            "algorithms.fedavg.server.optimizer",
        ),
        ({"model.name": "vit"}, "model.name: Input tag 'vit'"),
        ({"data.dataset": {"name": "imagenet"}}, "data.dataset.name: Input tag 'imagenet'"),
        (
            {"experiment.runs": ["fedavg", "nope"]},
            "experiment.runs[1]='nope' is not a key of algorithms",
        ),
        ({"train.local.steps": 5}, "set exactly one of epochs and steps"),
        (
            {"train.backend": "gpu"},
            "train.backend: Input should be 'sequential', 'vectorized' or 'auto'",
        ),
        ({"train.chunk_size": 0}, "train.chunk_size: Input should be an integer >= 1 or 'auto'"),
        (
            {"train.chunk_size": "max"},
            "train.chunk_size: Input should be an integer >= 1 or 'auto'",
        ),
        ({"train.device": "gpu"}, "train.device: Input should be auto, cpu, cuda, cuda:N"),
        ({"train.device": "cuda:-1"}, "train.device: Input should be auto, cpu, cuda, cuda:N"),
        ({"train.precision": "fp8"}, "train.precision: Input should be 'fp32', 'bf16' or 'fp16'"),
        ({"partition.test_fraction": 1.0}, "partition.test_fraction"),
        ({"partition.validation_fraction": -0.1}, "partition.validation_fraction"),
        ({"evaluate.targets": [1.5]}, "evaluate.targets.0"),
        ({"evaluate.upload_caps_gib": [1.0, 0.0]}, "evaluate.upload_caps_gib.1"),
        (
            {"partition": {"kind": "lotteryfl", "num_partitions": 8, "test_fraction": 0.2}},
            "partition.test_fraction: must be 0 for lotteryfl (got 0.2)",
        ),
    ],
)
def test_bad_values_are_named(override: dict[str, object], fragment: str) -> None:
    assert fragment in _error(**override)


def test_unknown_keys_list_the_allowed_ones() -> None:
    msg = _error(**{"algorithms.fedprox.server.beta3": 0.5, "partition.alpha_": 1})
    assert "algorithms.fedprox.server.beta3: Extra inputs are not permitted (got 0.5; " in msg
    assert "allowed keys: beta1, beta2, bias_correction, eps, lr, momentum" in msg
    assert "partition.alpha_" in msg and "allowed keys: alpha, kind, max_retries" in msg


def test_every_problem_is_listed_at_once() -> None:
    msg = _error(**{"train.local.lr": -1.0, "algorithms.fedprox.mu": -1, "model.depth": 3})
    assert "3 invalid value(s)" in msg
    for key in ("train.local.lr", "algorithms.fedprox.mu", "model.depth"):
        assert key in msg


def test_load_params_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_params(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)


def test_cli_validate_ok_and_bad(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(tiny_params()))
    res = CliRunner().invoke(app, ["config", "validate", "--params", str(good)])
    assert res.exit_code == 0 and "OK" in res.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny_params(**{"train.local.lr": 0})))
    res = CliRunner().invoke(app, ["config", "validate", "--params", str(bad)])
    assert res.exit_code == 2
    assert "train.local.lr" in res.output


def test_bad_params_leave_no_outputs(project: Path) -> None:
    (project / "params.yaml").write_text(
        yaml.safe_dump(tiny_params(**{"algorithms.fedavg.server.lr": -1}))
    )
    for argv in (["partition"], ["train", "--run", "fedavg"], ["summarize"]):
        res = CliRunner().invoke(app, argv)
        assert res.exit_code == 2, res.output
        assert "algorithms.fedavg.server.lr" in res.output
    assert sorted(p.name for p in project.iterdir()) == ["params.yaml"]


def test_model_configs_match_the_model_registry() -> None:
    import typing

    from fedcomm.config import model
    from fedcomm.models.registry import MODELS, option_names

    covered = set()
    for cls in typing.get_args(typing.get_args(model.ModelConfig)[0]):
        for name in typing.get_args(cls.model_fields["name"].annotation):
            covered.add(name)
            assert set(cls.model_fields) - {"name"} == set(option_names(name)), name
    assert covered == set(MODELS)


def test_partition_configs_match_the_partitioner_registry() -> None:
    """Every partition kind has a config whose own keys are its partitioner's parameters."""
    import inspect
    import typing

    from fedcomm.config import partition
    from fedcomm.data.partitioners import PARTITIONERS

    common = {"kind", "num_partitions", "test_fraction", "seed", "validation_fraction"}
    covered = set()
    for cls in typing.get_args(typing.get_args(partition.PartitionConfig)[0]):
        (kind,) = typing.get_args(cls.model_fields["kind"].annotation)
        covered.add(kind)
        accepted = set(inspect.signature(PARTITIONERS[kind]).parameters)
        assert set(cls.model_fields) - common <= accepted - {"labels", "rng", "natural_id"}, kind
    assert covered == set(PARTITIONERS)


def test_feddst_params_validate() -> None:
    p = validate_params(
        tiny_params(
            **{
                "partition": {"kind": "lotteryfl", "num_partitions": 8},
                "model": {"name": "feddst_cnn", "channels": [6, 16], "hidden": [120, 84]},
                "evaluate.upload_caps_gib": [0.5, 1],
            }
        )
    )
    assert p.partition.test_fraction == 0.0
    assert p.evaluate.upload_caps_gib == [0.5, 1.0]
    assert validate_params(tiny_params()).evaluate.upload_caps_gib == []


def test_feddst_cnn_widths_default_to_null_and_are_checked_by_key() -> None:
    """null widths = the paper's net for the data's input (resolved by the model factory);
    explicit ones are kept as given, and bad ones are refused before any work."""
    p = validate_params(tiny_params(model={"name": "feddst_cnn"}))
    off = {"softmax_output": False}
    assert p.model.model_dump() == {"name": "feddst_cnn", "channels": None, "hidden": None} | off
    p = validate_params(tiny_params(model={"name": "feddst_cnn", "hidden": []}))
    assert p.model.model_dump() == {"name": "feddst_cnn", "channels": None, "hidden": []} | off
    assert "model.softmax_output" in _error(model={"name": "feddst_cnn", "softmax_output": 2})
    assert "model.channels" in _error(model={"name": "feddst_cnn", "channels": [6]})
    assert "model.hidden.0" in _error(model={"name": "feddst_cnn", "hidden": [0]})


def test_feddst_readjust_end_defaults_to_half_the_rounds() -> None:
    algos = {"dst": {"name": "feddst"}, "dst40": {"name": "feddst", "readjust_end": 40}}
    raw = tiny_params(**{"algorithms": algos, "experiment.runs": ["dst"], "train.rounds": 30})
    p = validate_params(raw)
    assert p.algorithm("dst").readjust_end == 15  # type: ignore[attr-defined]
    assert p.algorithm("dst40").readjust_end == 40  # type: ignore[attr-defined]


def test_dataset_configs_cover_the_dataset_registry() -> None:
    import typing

    from fedcomm.config import data
    from fedcomm.data.datasets.registry import DATASETS

    names = {
        n
        for cls in typing.get_args(typing.get_args(data.DatasetConfig)[0])
        for n in typing.get_args(cls.model_fields["name"].annotation)
    }
    assert names == set(DATASETS)


def test_dataset_config_defaults_are_accepted_by_the_loaders(tmp_path: Path) -> None:
    """Every option a dataset config passes is one its loader accepts (with its defaults)."""
    import typing

    from fedcomm.config import data
    from fedcomm.data.datasets.registry import load_dataset
    from fedcomm.data.datasets.verify import DatasetNotFoundError

    for cls in typing.get_args(typing.get_args(data.DatasetConfig)[0]):
        for name in typing.get_args(cls.model_fields["name"].annotation):
            required = {"path": "images"} if name == "image_folder" else {}  # no default
            cfg = data.DataConfig(dataset={"name": name, **required})  # type: ignore[arg-type]
            with contextlib.suppress(DatasetNotFoundError):  # options accepted, files absent
                load_dataset(name, tmp_path, **cfg.options())


def test_bad_input_fails_before_any_mlflow_run(project: Path) -> None:
    """A model that does not fit the data is caught before a run is opened or trained."""
    assert CliRunner().invoke(app, ["partition"]).exit_code == 0
    (project / "params.yaml").write_text(
        yaml.safe_dump(tiny_params(**{"model": {"name": "cnn"}}))  # 3x32x32 CNN vs 1x8x8 digits
    )
    res = CliRunner().invoke(app, ["partition"])
    res = CliRunner().invoke(app, ["train", "--run", "fedavg"])
    assert res.exit_code == 2, res.output
    assert "model: 'cnn' does not fit dataset 'digits'" in res.output
    assert not (project / "mlflow.db").exists()
    assert not (project / "runs").exists()
    res = CliRunner().invoke(app, ["train", "--run", "fedavg", "--seed", "-1"])
    assert res.exit_code == 2 and "seed: must be >= 0" in res.output


def test_missing_dataset_is_one_clear_line(project: Path, tmp_path: Path) -> None:
    raw = tiny_params(**{"data": {"root": str(tmp_path / "nowhere"), "dataset": {"name": "mnist"}}})
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    res = CliRunner().invoke(app, ["partition"])
    assert res.exit_code == 2
    assert "error:" in res.output and "train-images-idx3-ubyte" in res.output
    assert "Traceback" not in res.output


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_device_this_machine_lacks_stops_train_before_any_work(project: Path) -> None:
    """``train.device: cuda`` on a machine without CUDA: exit 2, the key, what is allowed, and
    nothing trained or tracked (the partition, made first, is the only output)."""
    (project / "params.yaml").write_text(yaml.safe_dump(tiny_params(**{"train.device": "cuda"})))
    assert CliRunner().invoke(app, ["partition"]).exit_code == 0
    before = sorted(p.relative_to(project) for p in project.rglob("*"))
    res = CliRunner().invoke(app, ["train", "--run", "fedavg"])
    assert res.exit_code == 2, res.output
    assert "error: train.device: 'cuda' is not available" in res.output
    assert "allowed here: ['auto', 'cpu'" in res.output
    assert "Traceback" not in res.output
    assert sorted(p.relative_to(project) for p in project.rglob("*")) == before
    res = CliRunner().invoke(app, ["config", "validate"])
    assert res.exit_code == 2 and "train.device: 'cuda' is not available" in res.output


def test_device_precision_and_auto_chunks_reach_the_loop() -> None:
    """params' train.device / precision / chunk_size are what the round loop runs with, and
    they are part of the run's identity (its config hash)."""
    from fedcomm.stages.identity import config_hash, resolved_run_config
    from fedcomm.stages.train import loop_config

    base = validate_params(tiny_params())
    cfg = loop_config(base, 0, "fedavg")
    assert (cfg.device, cfg.precision, cfg.chunk_size) == ("auto", "fp32", 128)
    other = validate_params(
        tiny_params(
            **{"train.device": "cpu", "train.precision": "bf16", "train.chunk_size": "auto"}
        )
    )
    cfg = loop_config(other, 0, "fedavg")
    assert (cfg.device, cfg.precision, cfg.chunk_size) == ("cpu", "bf16", "auto")
    hashes = {
        config_hash(resolved_run_config(p, "fedavg", 0, "p"))
        for p in (base, other, validate_params(tiny_params(**{"train.precision": "bf16"})))
    }
    assert len(hashes) == 3
