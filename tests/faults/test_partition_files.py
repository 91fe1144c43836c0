"""Fault injection on the partition files that `fedcomm train` reads: each file missing, empty,
truncated, corrupted and from another version ends in one `error:` line that names the file and
the remedy, exit status 2, no traceback, no run output and no MLflow run left `RUNNING`."""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from fedcomm.cli import app
from tests.faults._project import enter_copy

pytestmark = pytest.mark.slow

PART = Path("data") / "partition"


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(4, len(data) - 8, 7):  # keep parquet's magic bytes, garble the rest
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _old_assignments(path: Path) -> None:  # another layout: columns renamed
    pl.read_parquet(path).rename({"client_id": "client"}).write_parquet(path)


def _old_manifest(path: Path) -> None:  # another layout: the keys this version reads are gone
    path.write_text(json.dumps({"version": 0, "clients": 3}))


FAULTS: dict[str, Callable[[Path], None]] = {
    "missing": lambda p: p.unlink(),
    "empty": lambda p: p.write_bytes(b""),
    "truncated": _truncate,
    "corrupted": _corrupt,
}
FILES = {"assignments.parquet": _old_assignments, "manifest.json": _old_manifest}
CASES = [(f, k) for f in FILES for k in [*FAULTS, "wrong_version"]]


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny project with its partition built once (each case works on a copy)."""
    import yaml

    from tests.conftest import tiny_params

    root = tmp_path_factory.mktemp("faults")
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(**{"train.rounds": 1})))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("FEDCOMM_PROJECT_ROOT", str(root))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        assert CliRunner().invoke(app, ["partition"]).exit_code == 0
    return root


def _running_mlflow_runs(root: Path) -> int:
    db = root / "mlflow.db"
    if not db.exists():
        return 0
    with sqlite3.connect(db) as con:
        return int(con.execute("select count(*) from runs where status = 'RUNNING'").fetchone()[0])


def _expect_clean_failure(root: Path, names: str) -> None:
    res = CliRunner().invoke(app, ["train", "--run", "fedavg", "--seed", "0"])
    out = res.output.strip()
    assert res.exit_code == 2, out
    assert out.startswith("error: ") and "\n" not in out and "Traceback" not in out, out
    assert names in out and "fedcomm partition" in out, out  # the file and the remedy
    assert not (root / "runs").exists() or not any((root / "runs").rglob("*.pt"))
    assert _running_mlflow_runs(root) == 0


@pytest.fixture
def project_copy(partitioned: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh copy of the partitioned project, as the working directory."""
    return enter_copy(partitioned, tmp_path / "project", monkeypatch)


@pytest.mark.parametrize(("name", "fault"), CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_a_damaged_partition_file_is_named_not_a_traceback(
    project_copy: Path, name: str, fault: str
) -> None:
    path = project_copy / PART / name
    (FILES[name] if fault == "wrong_version" else FAULTS[fault])(path)
    _expect_clean_failure(project_copy, name)


def test_a_missing_partition_directory_is_named(project_copy: Path) -> None:
    shutil.rmtree(project_copy / PART)
    _expect_clean_failure(project_copy, "partition")
