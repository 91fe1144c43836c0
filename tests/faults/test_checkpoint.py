"""Fault injection on the checkpoint a killed run leaves (``.fedcomm/checkpoints/<run>-s<seed>/
state.pt``). A checkpoint is a cache, not an input the user wrote: one that cannot be resumed is
not an error. ``train`` prints ONE ``warning:`` line naming the file and why (for an unreadable
one, torch's whole reason: issue 42 item 5), restarts at round 1, ends with exactly the numbers
of an uninterrupted run, marks the killed MLflow run ``FAILED`` and leaves no run ``RUNNING``.
(Subprocesses, so the warning reaches stderr as a user sees it.)"""

from __future__ import annotations

import shutil
import signal
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
import torch
from mlflow import MlflowClient

from fedcomm.errors import one_line
from fedcomm.simulation.checkpoint import FORMAT_VERSION
from fedcomm.simulation.loop import CRASH_ENV
from tests.unit.simulation.test_resume import _fedcomm, _numbers, _runs, _setup

pytestmark = pytest.mark.slow

CKPT = Path(".fedcomm") / "checkpoints" / "fedavg-s0" / "state.pt"


def _rewrite(path: Path, change: Callable[[dict], None]) -> None:  # type: ignore[type-arg]
    blob = torch.load(path, weights_only=False)
    change(blob)
    torch.save(blob, path)


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(64, len(data), 5):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _other_params(blob: dict) -> None:  # type: ignore[type-arg]
    blob["state"].config_hash = "0" * 64


FAULTS: dict[str, tuple[Callable[[Path], None], str | None]] = {
    # fault: (how, what the warning says; None: no warning, the run just starts afresh)
    "missing": (lambda p: p.unlink(), None),
    "empty": (lambda p: p.write_bytes(b""), "is unreadable"),
    "truncated": (lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]), "unreadable"),
    "corrupted": (_corrupt, "is unreadable"),
    "wrong_version": (
        lambda p: _rewrite(p, lambda b: b.update(version=FORMAT_VERSION + 1)),
        f"this version reads {FORMAT_VERSION}",
    ),
    "other_params": (lambda p: _rewrite(p, _other_params), "other params or code"),
}


def _torch_reason(path: Path) -> str | None:
    """What torch says of the file, on one line; None if it reads it."""
    try:
        torch.load(path, weights_only=False)
    except Exception as err:
        return one_line(err)
    return None


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pl.DataFrame]:
    """A project whose fedavg run was killed at round 3 (checkpoint of round 2 on disk), and the
    numbers of the same run uninterrupted."""
    base = tmp_path_factory.mktemp("ckpt")
    straight = _setup(base / "straight")
    assert _fedcomm(straight, "train", "--run", "fedavg").returncode == 0
    root = _setup(base / "killed")
    res = _fedcomm(root, "train", "--run", "fedavg", env={CRASH_ENV: "3"})
    assert res.returncode == -signal.SIGKILL, res.stderr
    assert (root / CKPT).is_file()
    return root, _numbers(straight / "runs" / "fedavg-s0" / "train")


@pytest.mark.parametrize("fault", list(FAULTS))
def test_an_unusable_checkpoint_warns_once_and_the_run_restarts_clean(
    killed: tuple[Path, pl.DataFrame], tmp_path: Path, fault: str
) -> None:
    source, expected = killed
    root = tmp_path / "project"
    shutil.copytree(source, root)
    damage, says = FAULTS[fault]
    damage(root / CKPT)
    reason = _torch_reason(root / CKPT) if (root / CKPT).exists() else None

    res = _fedcomm(root, "train", "--run", "fedavg")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    if says is None:
        assert warnings == [], res.stderr
    else:
        assert len(warnings) == 1, res.stderr
        assert str(CKPT) in warnings[0] and says in warnings[0], warnings
        assert "restarts at round 1" in warnings[0], warnings
        if reason is not None:  # the whole of it (a truncated file's runs to 337 characters)
            assert f"is unreadable ({reason});" in warnings[0], (reason, warnings)
    assert _numbers(root / "runs" / "fedavg-s0" / "train").equals(expected)
    runs = sorted(_runs(root), key=lambda r: r[1])
    assert runs == [("fedavg-s0", "FAILED", [1, 2, 3]), ("fedavg-s0", "FINISHED", [1, 2, 3, 4, 5])]
    client = MlflowClient(f"sqlite:///{root / 'mlflow.db'}")
    exp = client.get_experiment_by_name("tests")
    assert exp is not None
    failed = client.search_runs([exp.experiment_id], "attributes.status = 'FAILED'")[0]
    assert "checkpoint could not be resumed" in failed.data.tags["fedcomm.stopped"]
    assert not (root / CKPT).exists() and not (root / CKPT).with_name("mlflow_run_id").exists()
