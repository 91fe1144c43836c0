"""A Ctrl-C that lands inside a write to the MLflow store waits until the write is done.

Cut inside a write, MLflow's SQLite session kept the database's write lock (its cleanup catches
``Exception``, not ``KeyboardInterrupt``) until the interrupted connection was garbage-collected:
the run's own ``KILLED`` and every later write of the process waited 20 s and failed "database
is locked" (seen as a sweep whose interrupted trial failed the next three). Here the SIGINT is
sent from inside the store's first statement of a write, so it lands there every time."""

from __future__ import annotations

import os
import signal
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow import MlflowClient
from sqlalchemy import event
from sqlalchemy.engine import Engine

from fedcomm.tracking import mlflow as tracking


@pytest.fixture
def tracker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tracking.MlflowTracker:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("{}\n")  # the project root: its mlflow.db
    return tracking.open_run(uri=None, experiment="x", run_name="r", tags={}, params={"a": 1})


@pytest.fixture
def ctrl_c_in(tracker: tracking.MlflowTracker) -> Iterator[Callable[[str], list[str]]]:
    """``ctrl_c_in(prefix)``: a SIGINT sent from inside the next statement starting with
    ``prefix`` (once), under Python's own Ctrl-C handler; the statements it fired in."""
    fired: list[str] = []
    prefix: list[str] = []

    def send(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if prefix and statement.startswith(prefix[0]) and not fired:
            fired.append(statement)
            os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    event.listen(Engine, "after_cursor_execute", send)

    def arm(start: str) -> list[str]:
        prefix.append(start)
        return fired

    try:
        yield arm
    finally:
        event.remove(Engine, "after_cursor_execute", send)
        signal.signal(signal.SIGINT, previous)


def _writable(db: Path) -> bool:
    """Whether another connection (the next stage's process) can take the write lock now."""
    con = sqlite3.connect(db, timeout=0.5)
    try:
        con.execute("BEGIN IMMEDIATE")
        con.rollback()
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        con.close()


def test_a_round_cut_by_ctrl_c_is_logged_whole_and_the_store_stays_writable(
    tracker: tracking.MlflowTracker, ctrl_c_in: Callable[[str], list[str]], tmp_path: Path
) -> None:
    fired = ctrl_c_in("INSERT INTO metrics")
    with pytest.raises(KeyboardInterrupt):  # raised once the write is done
        tracker.log_round(1, {"global/accuracy": 0.5, "comm/cum_gib": 0.1})
    assert fired
    assert _writable(tmp_path / "mlflow.db")
    tracker.finish("KILLED")  # at once (cut inside the write, this waited 20 s and failed)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(tracker.run_id).info.status == "KILLED"
    assert [m.step for m in client.get_metric_history(tracker.run_id, "global/accuracy")] == [1]


def test_ctrl_c_inside_the_status_write_still_marks_the_run(
    tracker: tracking.MlflowTracker, ctrl_c_in: Callable[[str], list[str]], tmp_path: Path
) -> None:
    fired = ctrl_c_in("UPDATE runs")
    with pytest.raises(KeyboardInterrupt):
        tracker.finish("KILLED")
    assert fired and _writable(tmp_path / "mlflow.db")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert client.get_run(tracker.run_id).info.status == "KILLED"
