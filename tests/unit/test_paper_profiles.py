"""The paper-size profiles (issue 17) hold the papers' values, and without their data
`fedcomm config validate` stops in one line that says which file to put where.

No dataset is read: the models are built from the profiles' shapes, and validation runs against
an empty data root."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.config import Params, load_params, model_options
from fedcomm.models import build_model
from tests.conftest import REPO

PROFILES = REPO / "pipeline" / "reproductions"

#: profile -> (one file the loader asks for, relative to the data root; input shape; classes)
DATA: dict[str, tuple[str, tuple[int, ...], int]] = {
    "fedsparse_cifar10": ("cifar10_jpeg/train", (3, 32, 32), 10),
    "feddst_cifar10": ("cifar10_jpeg/train", (3, 32, 32), 10),
    "progfed_cifar100": ("cifar-100-python/train", (3, 32, 32), 100),
    "fedbiad_ptb": ("ptb/ptb.train.txt", (35,), 10_000),
}
RUN_TIME = "Run time: "  # measured, or "not measured (no GPU was available ...)"


def _params(name: str) -> Params:
    return load_params(PROFILES / f"{name}.yaml")


def _num_params(name: str) -> int:
    p = _params(name)
    _, shape, classes = DATA[name]
    model = build_model(
        p.model.name, input_shape=shape, num_classes=classes, **model_options(p.model)
    )
    return sum(t.numel() for t in model.parameters())


def _reads_the_jpeg_copy(name: str) -> bool:
    """The CIFAR-10 profiles read the JPEG copy that exists offline (image_folder), and their
    header says the one params change for the python batches and what "lossy" means."""
    p = _params(name)
    header = (PROFILES / f"{name}.yaml").read_text(encoding="utf-8")
    batches = "cifar-10-batches-py/data_batch_1" in header and "test_batch" in header
    return (
        p.data.dataset.name == "image_folder"
        and p.data.options()["path"] == "cifar10_jpeg"
        and "one params change: data.dataset: {name: cifar10}" in header
        and batches
        and "lossy" in header
        and "(JPEG q75 copy)" in header
    )


@pytest.mark.parametrize("name", list(DATA))
def test_profile_validates_and_its_header_names_data_and_run_time(name: str) -> None:
    p = _params(name)
    assert set(p.experiment.runs) <= set(p.algorithms)
    for run in p.algorithms:
        p.algorithm(run)  # round-dependent defaults resolve
    header = (PROFILES / f"{name}.yaml").read_text(encoding="utf-8")
    assert DATA[name][0] in header  # the file the loader wants, where it wants it
    assert RUN_TIME in header


@pytest.mark.parametrize("name", list(DATA))
def test_validate_without_data_names_the_file_in_one_line(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "empty_root"
    root.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDCOMM_DATA_ROOT", str(root))
    res = CliRunner().invoke(
        app, ["config", "validate", "--params", str(PROFILES / f"{name}.yaml")]
    )
    out = res.output.strip()
    assert res.exit_code == 2, out
    assert out.startswith("error: dataset ") and "\n" not in out and "Traceback" not in out, out
    assert str(root / DATA[name][0]) in out and "FEDCOMM_DATA_ROOT" in out, out
    assert sorted(q.name for q in tmp_path.iterdir()) == ["empty_root"]  # nothing written


def test_fedsparse_cifar10_is_table_1() -> None:
    p = _params("fedsparse_cifar10")
    assert _reads_the_jpeg_copy("fedsparse_cifar10") and p.model.name == "cnn"
    assert p.partition.kind == "dirichlet" and p.partition.num_partitions == 100
    # the table's cut for this CPU (issue 29), stated in the profile beside the paper's 1000
    assert (p.train.rounds, p.train.clients_per_round) == (300, 10)
    text = (PROFILES / "fedsparse_cifar10.yaml").read_text()
    assert "CUT: 300 of the paper's 1000 rounds" in text
    local = p.train.local
    assert (local.epochs, local.batch_size, local.lr) == (1, 64, 0.05)
    assert p.train.backend == "auto"  # sequential on a CPU (conv nets), vectorized on a GPU
    assert p.train.local_eval_every == p.train.eval_every
    assert {"fedavg", "feddrop", "fedl1"} <= set(p.experiment.runs)
    lambdas = {
        r: p.algorithm(r).lambda0 for r in ("fedsparse_low", "fedsparse_mid", "fedsparse_high")
    }
    assert lambdas == {"fedsparse_low": 5e-7, "fedsparse_mid": 5e-6, "fedsparse_high": 5e-5}
    assert set(lambdas) <= set(p.experiment.runs)
    feddrop, fedl1 = p.algorithm("feddrop"), p.algorithm("fedl1")
    assert (feddrop.conv_rate, feddrop.fc_rate, fedl1.threshold) == (0.1, 0.5, 2e-3)
    for run in p.experiment.runs:
        server = p.algorithm(run).server
        assert (server.optimizer, server.lr) == ("adam", 1e-3)
    # the paper's LeNet-5, and FedAvg's whole run is the paper's 65.46 GiB budget (up + down)
    n = _num_params("fedsparse_cifar10")
    assert n == 878_538
    fedavg_gib = n * 4 * 2 * p.train.clients_per_round * 1000 / 2**30  # the paper's 1000 rounds
    assert round(fedavg_gib, 2) == 65.46 and fedavg_gib <= 65.46
    assert 65.46 in p.evaluate.budgets_gib


def test_feddst_cifar10_is_table_2() -> None:
    p = _params("feddst_cifar10")
    assert _reads_the_jpeg_copy("feddst_cifar10") and p.model.name == "feddst_cnn"
    part = p.partition
    assert part.kind == "lotteryfl"
    assert (part.num_partitions, part.shards_per_client, part.shard_size) == (400, 2, 20)
    assert part.test_per_class == 1000
    assert (p.train.rounds, p.train.clients_per_round) == (400, 20)
    local = p.train.local
    assert (local.epochs, local.batch_size, local.lr) == (10, 32, 0.01)
    assert (local.momentum, local.weight_decay) == (0.9, 1e-3)
    feddst = p.algorithm("feddst")
    assert (feddst.sparsity, feddst.alpha, feddst.readjust_every) == (0.8, 0.01, 15)
    assert feddst.readjust_end == 200  # the code's R // 2
    assert p.algorithm("randommask").sparsity == 0.8
    assert p.algorithm("fedprox").mu == 1.0
    assert {"fedavgm", "fedprox", "randommask", "prunefl", "feddst"} <= set(p.experiment.runs)
    assert p.evaluate.upload_caps_gib == [4.0, 8.0, 12.0, 16.0]
    assert p.train.backend == "auto"  # sequential on a CPU (conv nets), vectorized on a GPU
    assert p.train.local_eval_every == p.train.eval_every
    assert _num_params("feddst_cifar10") == 782_006


def test_progfed_cifar100_is_table_3() -> None:
    p = _params("progfed_cifar100")
    assert p.data.dataset.name == "cifar100" and p.model.name == "resnet18"
    assert p.partition.num_partitions == 500
    assert (p.train.rounds, p.train.clients_per_round) == (3000, 40)
    local = p.train.local
    assert (local.epochs, local.batch_size, local.lr) == (1, 20, 0.1)
    assert (local.momentum, local.weight_decay) == (0.9, 1e-4)
    progfed, e2e = p.algorithm("progfed"), p.algorithm("e2e")
    assert (progfed.stages, progfed.warmup_rounds, progfed.rounds) == (4, 25, 3000)
    assert progfed.rounds // (2 * progfed.stages) == 375  # T_s
    assert progfed.extra_rounds() == 75
    assert (e2e.stages, e2e.warmup_rounds) == (1, 0)
    assert {"e2e", "progfed"} <= set(p.experiment.runs)
    assert _num_params("progfed_cifar100") == 11_220_132


def test_fedbiad_ptb_is_table_1_ptb() -> None:
    p = _params("fedbiad_ptb")
    assert p.data.dataset.name == "ptb" and p.data.dataset.seq_len == 35
    assert p.partition.kind == "iid" and p.partition.num_partitions == 100
    assert (p.train.rounds, p.train.clients_per_round) == (60, 10)  # κ = 0.1
    assert p.train.local.clip_grad_norm == 0.25
    assert p.train.topk == 3 and p.evaluate.metric == "topk/accuracy"
    fedbiad = p.algorithm("fedbiad")
    assert (fedbiad.p, fedbiad.stage_boundary, fedbiad.tau) == (0.5, 55, 3)
    assert fedbiad.lstm_rows == "hh"
    assert {"fedavg", "fedbiad"} <= set(p.experiment.runs)
    m = p.model
    assert (m.embed_dim, m.hidden, m.num_layers, m.tie_weights) == (300, 300, 2, False)
    assert _num_params("fedbiad_ptb") == 7_454_800  # 29.8 MB, Table I
