"""A temporary git + DVC copy of the project for the pipeline tests, and a shell helper."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

COPY = ["dvc.yaml", "stages", "pipeline", "src", ".dvcignore", ".gitignore"]


def shell_env() -> dict[str, str]:
    """The environment with this interpreter's scripts (dvc, fedcomm) first on PATH and no
    tracking/project overrides (the copy's own mlflow.db is used)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for var in ("MLFLOW_TRACKING_URI", "FEDCOMM_PROJECT_ROOT"):
        env.pop(var, None)
    return env


def sh(cwd: Path, *cmd: str, timeout: int = 600) -> str:
    """Run ``cmd`` in ``cwd``; its stdout (the test fails with both streams if it fails)."""
    res = subprocess.run(
        cmd, cwd=cwd, env=shell_env(), capture_output=True, text=True, timeout=timeout
    )
    assert res.returncode == 0, f"{' '.join(cmd)} failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def commit(root: Path, message: str) -> None:
    sh(root, "git", "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    sh(root, "git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", message,
       "--allow-empty")  # fmt: skip


def build_repo(root: Path, params_text: str) -> Path:
    """Copy the pipeline into ``root`` with ``params_text`` as params.yaml, commit it and run
    ``dvc repro``."""
    for name in COPY:
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, root / name)
    (root / ".dvc").mkdir()
    shutil.copy(REPO / ".dvc" / "config", root / ".dvc" / "config")
    shutil.copy(REPO / ".dvc" / ".gitignore", root / ".dvc" / ".gitignore")
    (root / "params.yaml").write_text(params_text)
    sh(root, "git", "init", "-q")
    commit(root, "init")
    sh(root, "dvc", "repro")
    return root
