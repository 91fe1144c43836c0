"""A new MLflow store is made once per module (MLflow's schema migrations take seconds) and copied
into each test's project."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from fedcomm.tracking import mlflow as tracking


@pytest.fixture(scope="module")
def new_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty MLflow store (schema only, MLflow's ``Default`` experiment), made once."""
    root = tmp_path_factory.mktemp("store")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FEDCOMM_PROJECT_ROOT", str(root))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        tracking.init_store(None)
    return root / "mlflow.db"


@pytest.fixture
def store(project: Path, new_store: Path) -> Path:
    """The ``project`` (cwd, tiny params), with a copy of the new store as its ``mlflow.db``."""
    shutil.copyfile(new_store, project / "mlflow.db")
    return project
