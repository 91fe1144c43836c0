"""Fault injection on the MLflow store (``mlflow.db``, SQLite, at the project root): each damage
ends `fedcomm train`, `fedcomm evaluate` and `fedcomm report` in one `error:` line that names the
file and the remedy, exit status 2, no traceback, no train output and no MLflow run left
`RUNNING` (checked wherever the damaged file can still be read).

A missing or empty (0-byte) store is a *new* store for `train`: MLflow creates the file, or
initialises the empty one, and the run finishes (tried: MLflow 3.17 initialises a 0-byte file
without complaint, as SQLite treats it as an empty database). For `evaluate` and `report`, which
need the runs already logged, either is an error, and nothing is created in its place.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcomm.cli import app
from tests.faults._project import enter_copy

pytestmark = pytest.mark.slow

DB = "mlflow.db"
TRAINED = ["runs", "fedavg-s0", "train"]  # the module's good run (seed 0)
COMMANDS = {
    "train": ["train", "--run", "fedavg", "--seed", "1"],  # a new seed: its outputs must not appear
    "evaluate": ["evaluate", "--run", "fedavg", "--seed", "0"],
    "report": ["report", "--out", "reports/compare"],
}


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt(path: Path) -> None:  # every byte after the 100-byte SQLite header
    data = bytearray(path.read_bytes())
    for i in range(100, len(data)):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _xor_pages(path: Path, table: str) -> None:
    """Garble every page of ``table`` (found in SQLite's ``dbstat`` table)."""
    with sqlite3.connect(path) as con:
        size = int(con.execute("PRAGMA page_size").fetchone()[0])
        try:
            rows = con.execute("SELECT pageno FROM dbstat WHERE name = ?", (table,)).fetchall()
        except sqlite3.OperationalError:  # an SQLite built without the dbstat table
            pytest.skip("this SQLite has no dbstat table to find a table's pages")
    con.close()
    assert rows
    data = bytearray(path.read_bytes())
    for (page,) in rows:
        for i in range((int(page) - 1) * size, int(page) * size):
            data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _damage_params(path: Path) -> None:
    """The runs' params garbled: the file opens and its schema and schema revision read fine;
    only `PRAGMA quick_check` finds the damage."""
    _xor_pages(path, "params")


def _garble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:100] = bytes(b ^ 0xA5 for b in data[:100])
    path.write_bytes(bytes(data))


def _set_revision(revision: Callable[[], str]) -> Callable[[Path], None]:
    def fault(path: Path) -> None:
        with sqlite3.connect(path) as con:
            con.execute("UPDATE alembic_version SET version_num = ?", (revision(),))
        con.close()

    return fault


def _older_revision() -> str:
    """The revision before the installed MLflow's head (a store an older MLflow wrote)."""
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config, _get_latest_schema_revision

    script = ScriptDirectory.from_config(_get_alembic_config(db_url=""))
    down = script.get_revision(_get_latest_schema_revision()).down_revision
    assert isinstance(down, str)
    return down


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _other_database(path: Path) -> None:  # e.g. tracking.uri pointed at an Optuna store
    path.unlink()
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE studies (study_id INTEGER PRIMARY KEY, study_name TEXT)")
        con.execute("CREATE TABLE alembic_version (version_num TEXT)")
        con.execute("INSERT INTO alembic_version VALUES ('v3.2.0.a')")
    con.close()


FAULTS: dict[str, Callable[[Path], None]] = {
    "missing": lambda p: p.unlink(),
    "empty": lambda p: p.write_bytes(b""),
    "truncated": _truncate,
    "corrupted": _corrupt,
    "damaged_table": _damage_params,
    "bad_header": _garble_header,
    "old_schema": _set_revision(_older_revision),
    "new_schema": _set_revision(lambda: "ffffffffffff"),  # unknown to the installed MLflow
    "directory": _directory,
    "other_database": _other_database,
}
NEW_STORE = {"missing", "empty"}  # fine for train (a new store), errors for the readers
DAMAGED = "move it away (the next `fedcomm train` starts a new store) or restore it from a backup"
NO_RUNS = "restore it from a backup, run `fedcomm train` first"
REMEDY = {  # what the message must say, beyond the file's path
    "missing": ("no MLflow store (no such file); " + NO_RUNS,),
    "empty": ("empty (0 bytes), no MLflow runs in it; " + NO_RUNS,),
    "truncated": ("damaged (SQLite: database disk image is malformed); " + DAMAGED,),
    "corrupted": ("damaged (SQLite: database disk image is malformed); " + DAMAGED,),
    "damaged_table": ("damaged (SQLite: database disk image is malformed); " + DAMAGED,),
    "bad_header": ("not an SQLite database (its header is damaged, or it is another kind", DAMAGED),
    "old_schema": (
        "is older than mlflow ",
        "back the file up, then run `mlflow db upgrade sqlite:///",
    ),
    "new_schema": ("is unknown to mlflow ", "install the mlflow version that wrote it"),
    "directory": ("is a directory, not an MLflow store; move it away",),
    "other_database": ("not an MLflow store (tables: studies); point tracking.uri at another",),
}
CASES = [(f, c) for f in FAULTS for c in COMMANDS if not (f in NEW_STORE and c == "train")]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny project, partitioned and with `fedavg` seed 0 trained (one round) into its own
    `mlflow.db`, built once; each case works on a copy."""
    import yaml

    from tests.conftest import tiny_params

    root = tmp_path_factory.mktemp("store") / "project"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params(**{"train.rounds": 1})))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.setenv("FEDCOMM_PROJECT_ROOT", str(root))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        for args in (["partition"], ["train", "--run", "fedavg", "--seed", "0"]):
            res = CliRunner().invoke(app, args)
            assert res.exit_code == 0, res.output
    assert _statuses(root) == {"FINISHED": 1}
    return root


@pytest.fixture
def project_copy(trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh copy of the trained project, as the working directory."""
    return enter_copy(trained, tmp_path / "project", monkeypatch)


def _statuses(root: Path) -> dict[str, int] | None:
    """``{status: runs}`` in the store, or None where the file cannot be read as one."""
    db = root / DB
    if not db.is_file():
        return None
    try:
        with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as con:
            rows = con.execute("SELECT status, count(*) FROM runs GROUP BY status").fetchall()
        con.close()
    except sqlite3.DatabaseError:
        return None
    return {str(status): int(n) for status, n in rows}


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(f.relative_to(folder)): hashlib.sha256(f.read_bytes()).hexdigest()
        for f in sorted(folder.rglob("*"))
        if f.is_file()
    }


@pytest.mark.parametrize(("fault", "command"), CASES, ids=[f"{f}-{c}" for f, c in CASES])
def test_a_damaged_store_is_named_with_its_remedy(
    project_copy: Path, fault: str, command: str
) -> None:
    db = project_copy / DB
    trained_outputs = _digest(project_copy.joinpath(*TRAINED))
    FAULTS[fault](db)
    before = _statuses(project_copy)

    res = CliRunner().invoke(app, COMMANDS[command])
    out = res.output.strip()
    assert res.exit_code == 2, out
    assert out.startswith("error: ") and "\n" not in out and "Traceback" not in out, out
    assert out.startswith(f"error: {db}: "), out  # the file
    assert all(words in out for words in REMEDY[fault]), out  # what is wrong, the remedy
    if fault == "old_schema":  # a command that runs as printed
        assert f"run `mlflow db upgrade sqlite:///{db}`" in out, out
    assert not (project_copy / "runs" / "fedavg-s1").exists()  # no train output
    assert _digest(project_copy.joinpath(*TRAINED)) == trained_outputs
    assert not (project_copy / "reports").exists()
    after = _statuses(project_copy)
    assert after == before  # no run opened (so none left RUNNING) where the store is readable
    assert after is None or "RUNNING" not in after
    if fault == "missing":  # readers create no store in its place
        assert not db.exists()
    if fault == "empty":
        assert db.stat().st_size == 0


@pytest.mark.parametrize("fault", sorted(NEW_STORE))
def test_a_missing_or_empty_store_is_a_new_store_for_train(project_copy: Path, fault: str) -> None:
    FAULTS[fault](project_copy / DB)
    res = CliRunner().invoke(app, COMMANDS["train"])
    assert res.exit_code == 0, res.output
    assert (project_copy / "runs" / "fedavg-s1" / "train" / "run.json").is_file()
    assert _statuses(project_copy) == {"FINISHED": 1}


def test_a_store_without_the_trained_run_is_named(project_copy: Path) -> None:
    """The damaged store moved away (as the message advises) and a new one started by another
    run: evaluating the old run names the store and the run it lacks."""
    (project_copy / DB).unlink()
    assert CliRunner().invoke(app, COMMANDS["train"]).exit_code == 0  # a new store (seed 1)
    res = CliRunner().invoke(app, COMMANDS["evaluate"])
    out = res.output.strip()
    assert res.exit_code == 2, out
    assert out.startswith(f"error: {project_copy / DB}: has no MLflow run "), out
    assert "\n" not in out and "train the run again (`fedcomm train`)" in out, out
    assert _statuses(project_copy) == {"FINISHED": 1}


def test_a_failed_evaluate_writes_no_metrics(project_copy: Path) -> None:
    _corrupt(project_copy / DB)
    assert CliRunner().invoke(app, COMMANDS["evaluate"]).exit_code == 2
    for output in ("summary.json", "metrics.json"):
        assert not (project_copy / "runs" / "fedavg-s0" / output).exists()


def test_damage_found_by_quick_check_is_named_on_one_line(tmp_path: Path) -> None:
    """A garbled leaf page of a many-page table: SQLite opens the file and `PRAGMA quick_check`
    returns the problems as rows (not an exception); the first is shown."""
    from fedcomm.tracking.store import TrackingStoreError, check_store

    db = tmp_path / DB
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        con.executemany("INSERT INTO t (v) VALUES (?)", [("x" * 200,) for _ in range(500)])
        size = int(con.execute("PRAGMA page_size").fetchone()[0])
        try:
            leaf = "SELECT max(pageno) FROM dbstat WHERE name = 't' AND pagetype = 'leaf'"
            page = int(con.execute(leaf).fetchone()[0])
        except sqlite3.OperationalError:  # an SQLite built without the dbstat table
            pytest.skip("this SQLite has no dbstat table to find a table's pages")
    con.close()
    data = bytearray(db.read_bytes())
    for i in range((page - 1) * size + 8, page * size):  # all but the page's 8-byte header
        data[i] ^= 0x5A
    db.write_bytes(bytes(data))
    with pytest.raises(TrackingStoreError) as err:
        check_store(f"sqlite:///{db}?timeout=60", create=True)
    message = str(err.value)
    assert message.startswith(
        f"{db}: the MLflow store is damaged (SQLite quick_check: On tree page {page} cell "
    ), message
    assert message.endswith(f" more)); {DAMAGED}") and "\n" not in message, message
