"""The fault modules' shared step: a fresh copy of a prepared project as the working directory."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


def enter_copy(source: Path, dest: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Copy ``source`` to ``dest`` and make it the project (cwd, its own MLflow store)."""
    shutil.copytree(source, dest)
    monkeypatch.chdir(dest)
    monkeypatch.setenv("FEDCOMM_PROJECT_ROOT", str(dest))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return dest
