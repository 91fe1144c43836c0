"""Shared fixtures: the offline data root, tiny params, an isolated project directory."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"

# The decode cache of image_folder datasets: one throwaway folder for the whole test session
# (inherited by the stages' subprocesses), so tests never write to the user's ~/.cache and the
# real CIFAR-10 copy is decoded at most once per session. A caller's own setting wins.
if "FEDCOMM_CACHE_DIR" not in os.environ:
    os.environ["FEDCOMM_CACHE_DIR"] = tempfile.mkdtemp(prefix="fedcomm-test-cache-")
    atexit.register(shutil.rmtree, os.environ["FEDCOMM_CACHE_DIR"], ignore_errors=True)


# Under pytest-xdist (`make test`: a worker per core) each worker computes on one thread, and so
# do the stage scripts it starts: a thread pool per core in every worker oversubscribes the
# cores (each pool's threads spin waiting for the others). A caller's own setting wins.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("OMP_NUM_THREADS") == "1":
        import torch  # (after the variables above: torch reads them when it starts)

        torch.set_num_threads(1)


@pytest.fixture(scope="session")
def data_root() -> Path:
    root = Path(os.environ.get("FEDCOMM_DATA_ROOT", SHARED_DATA))
    if not (root / "mnist").is_dir():
        message = f"offline datasets not found at {root} (set FEDCOMM_DATA_ROOT)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI must exercise the real datasets, never skip them
        pytest.skip(message)
    return root


def tiny_params(**overrides: Any) -> dict[str, Any]:
    """A small but real experiment on digits: 8 clients, 3 per round, 3 rounds."""
    raw: dict[str, Any] = {
        "data": {"dataset": {"name": "digits"}},
        "partition": {
            "kind": "dirichlet",
            "num_partitions": 8,
            "alpha": 1.0,
            "min_partition_size": 20,
            "seed": 0,
        },
        "model": {"name": "mlp", "hidden": [16]},
        "train": {
            "rounds": 3,
            "clients_per_round": 3,
            "local": {"epochs": 1, "batch_size": 16, "lr": 0.05},
            "checkpoint_every": 1,
        },
        "experiment": {"runs": ["fedavg", "fedprox"], "seeds": [0]},
        "algorithms": {
            "fedavg": {"name": "fedavg", "server": {"optimizer": "sgd", "lr": 1.0}},
            "fedprox": {"name": "fedprox", "mu": 0.01},
        },
        "evaluate": {"budgets_gib": [0.0001], "targets": [0.5]},
        "summarize": {"title": "tiny"},
        "tracking": {"experiment": "tests"},
    }
    for dotted, value in overrides.items():
        node = raw
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return raw


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An isolated project directory (cwd) with its own MLflow store and the tiny params."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FEDCOMM_PROJECT_ROOT", str(tmp_path))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(tiny_params()))
    yield tmp_path
    shutil.rmtree(tmp_path / ".fedcomm", ignore_errors=True)


@functools.cache
def digits_federation(num_clients: int = 6) -> Any:
    """A small real federation: digits, Dirichlet(1.0) over ``num_clients``, 80/20 splits."""
    from fedcomm.data.datasets.registry import load_dataset
    from fedcomm.data.federated import PartitionSpec, make_partition
    from fedcomm.simulation.data import FederatedTensors

    ds = load_dataset("digits")
    spec = PartitionSpec("dirichlet", num_clients, {"alpha": 1.0, "min_partition_size": 20}, 0.2, 0)
    part = make_partition(ds, spec)
    return FederatedTensors.build(ds, part.train, part.test)


def tiny_cnn(fed: Any) -> Any:
    """A small seeded ``mnist_cnn`` (channels 4, 8; hidden 16) for ``fed``'s shapes."""
    import torch

    from fedcomm.models import build_model

    torch.manual_seed(0)
    return build_model(
        "mnist_cnn",
        input_shape=fed.input_shape,
        num_classes=fed.num_classes,
        channels=[4, 8],
        hidden=16,
    )


def small_loop(fed: Any, **cfg: Any) -> tuple[Any, Any]:
    """A seeded 16-unit MLP for ``fed`` and a 2-round, 3-client loop config (``cfg`` overrides;
    ``lr`` goes to the local SGD)."""
    import torch

    from fedcomm.algorithms.core.local import LocalConfig
    from fedcomm.models import build_model
    from fedcomm.simulation import loop

    torch.manual_seed(0)
    model = build_model(
        "mlp", input_shape=fed.input_shape, num_classes=fed.num_classes, hidden=[16]
    )
    local = LocalConfig(epochs=1, batch_size=16, lr=cfg.pop("lr", 0.05))
    defaults: dict[str, Any] = {"rounds": 2, "clients_per_round": 3, "seed": 7}
    return model, loop.LoopConfig(local=local, **(defaults | cfg))
