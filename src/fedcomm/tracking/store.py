"""The check made on opening a local MLflow store: a damaged one is named, with the remedy.

Left to itself, MLflow meets a damaged SQLite store deep inside SQLAlchemy (a long traceback
ending in ``database disk image is malformed``, ``file is not a database`` or ``disk I/O error``)
and a store of another MLflow version with a multi-line ``MlflowException``; a run it opened
before such a failure could be left ``RUNNING``. So every function of :mod:`fedcomm.tracking` that
opens a store calls :func:`check_store` first, before MLflow touches the file, and a store that
cannot be used ends in one :class:`TrackingStoreError` (an :class:`~fedcomm.errors.InputError`:
the CLI prints one ``error:`` line and exits 2) that names the file and the remedy.

The check is cheap: the 16-byte SQLite header, ``PRAGMA quick_check`` (about 0.15 s on a 100 MB
store) and the store's alembic revision compared with the installed MLflow's head revision. It runs
once per file (device and inode) per process; a file that passed is not checked again.

What is checked, for a ``sqlite:///`` URI only (a tracking server or another database keeps
MLflow's own errors):

* no file, an empty (0-byte) file or a database without tables: a *new* store, which MLflow
  creates or initialises when ``create`` is set (train, a sweep); an error for readers
  (evaluate, report), which need the runs that are not there;
* a directory, a file that is not SQLite, a damaged database (``quick_check`` fails), a locked or
  unreadable one, an SQLite database of something else (no MLflow tables);
* a schema older than the installed MLflow's (``mlflow db upgrade``), or a revision MLflow does not
  know (a newer MLflow wrote it).
"""

from __future__ import annotations

import functools
import os
import sqlite3
import stat
from contextlib import closing
from pathlib import Path

from fedcomm.errors import InputError, one_line

SQLITE_TIMEOUT_S = 60  # seconds a connection waits on a locked database
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first 16 bytes of every SQLite database file
MLFLOW_TABLES = frozenset({"experiments", "runs"})  # present in every MLflow schema revision

DAMAGED = "move it away (the next `fedcomm train` starts a new store) or restore it from a backup"
NO_RUNS = (
    "restore it from a backup, run `fedcomm train` first, or point tracking.uri "
    "(`fedcomm report --uri`) at the store that holds the runs"
)


class TrackingStoreError(InputError):
    """The tracking store cannot be used as it is; the message names it and the remedy."""


def sqlite_path(uri: str) -> Path | None:
    """The file of a ``sqlite:///`` URI (its query, e.g. ``?timeout=60``, dropped), else None."""
    prefix = "sqlite:///"
    return Path(uri[len(prefix) :].split("?", 1)[0]) if uri.startswith(prefix) else None


_passed: set[tuple[int, int]] = set()  # (device, inode) of the stores that passed in this process


def check_store(uri: str, *, create: bool) -> None:
    """Check the SQLite store of the resolved tracking ``uri`` before MLflow opens it.

    Args:
        uri: a resolved tracking URI (:func:`fedcomm.tracking.mlflow.resolve_tracking_uri`);
            anything but ``sqlite:///`` is not checked.
        create: the caller may start a new store (a missing or empty file is fine); readers pass
            ``False``, so a store without runs is an error instead of a new, empty store.

    Raises:
        TrackingStoreError: naming the file, what is wrong with it and the remedy.
    """
    db = sqlite_path(uri)
    if db is None:
        return
    try:
        st = db.stat()
    except FileNotFoundError:
        if create:
            return
        raise TrackingStoreError(f"{db}: no MLflow store (no such file); {NO_RUNS}") from None
    except OSError as err:
        raise TrackingStoreError(
            f"{db}: cannot be read ({err.strerror}); fix its permissions, or point tracking.uri "
            "at another store"
        ) from None
    if stat.S_ISDIR(st.st_mode):
        raise TrackingStoreError(
            f"{db}: is a directory, not an MLflow store; move it away (the next `fedcomm train` "
            "starts a new store) or point tracking.uri at a file"
        )
    if (st.st_dev, st.st_ino) in _passed:
        return
    if st.st_size == 0:
        if create:
            return  # MLflow initialises an empty file as a new store
        raise TrackingStoreError(f"{db}: empty (0 bytes), no MLflow runs in it; {NO_RUNS}")
    _check_header(db)
    tables, revisions = _read_schema(db)
    if not tables or (tables >= MLFLOW_TABLES and not revisions):
        if create:  # a new database, or MLflow's creation of the store was interrupted
            return
        raise TrackingStoreError(f"{db}: holds no MLflow store (no schema revision); {NO_RUNS}")
    if not tables >= MLFLOW_TABLES:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        raise TrackingStoreError(
            f"{db}: an SQLite database but not an MLflow store (tables: {shown}); "
            "point tracking.uri at another file, or move this one away"
        )
    _check_revision(db, revisions)
    _passed.add((st.st_dev, st.st_ino))


def _check_header(db: Path) -> None:
    try:
        with open(db, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except OSError as err:
        raise TrackingStoreError(
            f"{db}: cannot be read ({err.strerror}); fix its permissions, or point tracking.uri "
            "at another store"
        ) from None
    if head != SQLITE_MAGIC:
        raise TrackingStoreError(
            f"{db}: not an SQLite database (its header is damaged, or it is another kind of "
            f"file); {DAMAGED}"
        )


def _read_schema(db: Path) -> tuple[set[str], list[str]]:
    """``PRAGMA quick_check``, then the database's table names and alembic revision(s).

    Opened read-write without creating (``mode=rw``), so a hot journal left by a killed writer is
    rolled back as MLflow itself would, instead of reading as damage; nothing is written."""
    target = f"{Path(os.path.abspath(db)).as_uri()}?mode=rw"
    try:
        with closing(sqlite3.connect(target, uri=True, timeout=SQLITE_TIMEOUT_S)) as con:
            problems = [
                " ".join(line.split())
                for row in con.execute("PRAGMA quick_check")
                for line in str(row[0]).splitlines()
                if line.strip() and not line.startswith("*** in database")
            ]
            if problems != ["ok"]:
                more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
                raise TrackingStoreError(
                    f"{db}: the MLflow store is damaged (SQLite quick_check: "
                    f"{problems[0] if problems else 'failed'}{more}); {DAMAGED}"
                )
            tables = {
                str(row[0])
                for row in con.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table' "
                    "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'"
                )
            }
            revisions: list[str] = []
            if "alembic_version" in tables:
                rows = con.execute("SELECT version_num FROM alembic_version").fetchall()
                revisions = sorted(str(row[0]) for row in rows)
            tables.discard("alembic_version")
    except sqlite3.Error as err:
        raise _sqlite_error(db, err) from None
    return tables, revisions


def _sqlite_error(db: Path, err: sqlite3.Error) -> TrackingStoreError:
    name = getattr(err, "sqlite_errorname", "")
    what = one_line(err)
    if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return TrackingStoreError(
            f"{db}: locked by another process for over {SQLITE_TIMEOUT_S} s ({what}); retry "
            "once that process is done"
        )
    if name.startswith(("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_READONLY", "SQLITE_AUTH")):
        return TrackingStoreError(
            f"{db}: cannot be opened ({what}); fix its permissions, or point tracking.uri at "
            "another store"
        )
    return TrackingStoreError(f"{db}: the MLflow store is damaged (SQLite: {what}); {DAMAGED}")


@functools.cache
def mlflow_revisions() -> tuple[str, frozenset[str]] | None:
    """The installed MLflow's head schema revision (what MLflow's own ``_verify_schema`` compares
    a store with) and every revision its migrations know; None if this MLflow no longer has the
    (private) helpers used here, and then MLflow's own schema check is left to speak."""
    try:
        from alembic.script import ScriptDirectory
        from mlflow.store.db.utils import _get_alembic_config, _get_latest_schema_revision

        script = ScriptDirectory.from_config(_get_alembic_config(db_url=""))
        known = frozenset(str(rev.revision) for rev in script.walk_revisions())
        return str(_get_latest_schema_revision()), known
    except Exception:  # another MLflow layout: not a problem of the user's store
        return None


def _check_revision(db: Path, revisions: list[str]) -> None:
    import mlflow

    installed = mlflow_revisions()
    if installed is None:
        return
    head, known = installed
    if revisions == [head]:
        return
    found = ", ".join(revisions)
    version = f"mlflow {mlflow.__version__}"
    if revisions and all(rev in known for rev in revisions):
        raise TrackingStoreError(
            f"{db}: the MLflow store's schema (revision {found}) is older than {version} "
            f"uses ({head}); back the file up, then run `mlflow db upgrade sqlite:///{db}`"
        )
    raise TrackingStoreError(
        f"{db}: the MLflow store's schema revision {found} is unknown to {version} (head "
        f"{head}; a newer mlflow wrote it?); install the mlflow version that wrote it, or point "
        "tracking.uri at another store"
    )
