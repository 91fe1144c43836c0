"""`make reproduce` survives a kill: the whole process group (make, dvc, the train stage) is killed
with SIGKILL mid-way through a train stage, and rerunning `make reproduce` keeps the finished run,
continues the interrupted one from its checkpoint in the same MLflow run, and ends with the numbers
of an uninterrupted run (the FRESH=1 run that follows, which starts over). Changed code is refused
unless FRESH=1 or KEEP_CODE=1; bad arguments end with one `error:` line and exit status 2.

Everything runs in a temporary copy of the project (its Makefile, pipeline/reproduce.sh, dvc.yaml,
stages, src) with a test-only profile (PROFILE=...), against this interpreter's virtualenv."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
import yaml
from mlflow import MlflowClient

from fedcomm.sparse_io import load_sparse
from tests.conftest import REPO, tiny_params
from tests.pipeline._repo import shell_env

ROUNDS = 20  # the victim is stopped at a checkpoint of round >= 2, long before its last round
VENV = Path(sys.prefix)  # the virtualenv running the tests; `make` must not reinstall it
FILES = ["Makefile", "dvc.yaml", ".dvcignore", ".dvc/config", ".dvc/.gitignore", "stages"]
FILES += ["src/fedcomm", "pipeline/reproduce.sh", "pipeline/plots"]


def _project(root: Path) -> Path:
    """A copy of what `make reproduce` needs, and the test profile ``t.yaml`` (2 runs, 1 seed)."""
    for name in FILES:
        src, dest = REPO / name, root / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dest, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dest)
    params = tiny_params(**{"train.rounds": ROUNDS, "tracking.experiment": "resume"})
    (root / "t.yaml").write_text(yaml.safe_dump(params))
    return root


def _make(*args: str) -> list[str]:
    # -o: the virtualenv counts as installed (its stamp is never remade from the copy's files)
    return ["make", "-s", "-o", f"{VENV}/.installed", f"VENV={VENV}", "reproduce", "NAME=t",
            "PROFILE=t.yaml", *args]  # fmt: skip


def _run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        _make(*args), cwd=root, env=shell_env(), capture_output=True, text=True, timeout=600
    )


def _round(ckpt: Path) -> int:
    """The round a checkpoint holds (-1 if it is gone)."""
    try:
        return int(torch.load(ckpt, weights_only=False)["state"].round_)
    except FileNotFoundError:
        return -1


def _kill_mid_train(root: Path) -> tuple[str, int, int]:
    """Run `make reproduce` and SIGKILL its process group once one run has finished training
    and another has checkpointed round >= 2 (frozen with SIGSTOP first, so the kill lands while
    its checkpoint is on disk). Returns the victim, its checkpoint's round, the kill time (ms)."""
    build = root / "build" / "t"
    proc = subprocess.Popen(
        _make(), cwd=root, env=shell_env(), start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 400
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            finished = {p.parent.parent.name for p in build.glob("runs/*/train/run.json")}
            for ckpt in build.glob(".fedcomm/checkpoints/*/state.pt"):
                if not finished or ckpt.parent.name in finished or _round(ckpt) < 2:
                    continue
                os.killpg(proc.pid, signal.SIGSTOP)
                if ckpt.is_file():  # still training: kill it here
                    os.killpg(proc.pid, signal.SIGKILL)
                    killed_ms = int(time.time() * 1000)
                    assert proc.wait(timeout=60) == -signal.SIGKILL
                    return ckpt.parent.name, _round(ckpt), killed_ms
                os.killpg(proc.pid, signal.SIGCONT)  # it finished meanwhile: wait for the next
            time.sleep(0.02)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=60)
    pytest.fail(f"no train stage could be killed mid-way (make exited {proc.returncode})")


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_ino, st.st_mtime_ns


def _train_files(build: Path, run: str) -> dict[str, tuple[int, int]]:
    folder = build / "runs" / run / "train"
    return {f.name: _stat(f) for f in sorted(folder.iterdir())}


def _untimed(node: Any) -> Any:
    """A summary.json without its wall-clock entries (``time``, ``tta_s``)."""
    if isinstance(node, dict):
        return {k: _untimed(v) for k, v in node.items() if k not in ("time", "tta_s")}
    return node


def _numbers(build: Path, run: str) -> dict[str, Any]:
    """Everything a run computed (wall-clock times aside): rounds, ledger, model, metrics."""
    folder = build / "runs" / run
    rounds = pl.read_parquet(folder / "train" / "rounds.parquet")
    model = load_sparse(folder / "train" / "model.safetensors")
    return {
        "rounds": rounds.select([c for c in rounds.columns if not c.startswith("time/")]),
        "ledger": pl.read_parquet(folder / "train" / "ledger.parquet"),
        "model": {k: v.tolist() for k, v in model.items()},
        "metrics": _untimed(json.loads((folder / "summary.json").read_text())),
    }


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    frames = all(a[k].equals(b[k]) for k in ("rounds", "ledger"))
    return frames and a["model"] == b["model"] and a["metrics"] == b["metrics"]


def _mlflow(root: Path) -> MlflowClient:
    return MlflowClient(f"sqlite:///{root / 'mlflow.db'}")


def _run_ids(root: Path, run: str) -> list[str]:
    exp = _mlflow(root).get_experiment_by_name("resume")
    assert exp is not None
    found = _mlflow(root).search_runs([exp.experiment_id], f"attributes.run_name = '{run}'")
    return sorted(r.info.run_id for r in found)


def _run_json(build: Path, run: str) -> str:
    info = json.loads((build / "runs" / run / "train" / "run.json").read_text())
    return str(info["mlflow_run_id"])


@pytest.mark.slow
def test_rerun_resumes_a_killed_build_and_fresh_starts_over(tmp_path: Path) -> None:
    root = _project(tmp_path)
    build = root / "build" / "t"
    victim, ckpt_round, killed_ms = _kill_mid_train(root)
    assert 2 <= ckpt_round < ROUNDS
    done = ({"fedavg-s0", "fedprox-s0"} - {victim}).pop()
    kept = _train_files(build, done)
    assert not (build / "runs" / victim / "train").exists()  # nothing half-written
    sidecar = build / ".fedcomm" / "checkpoints" / victim / "mlflow_run_id"
    victim_id = sidecar.read_text().strip()
    # what a kill can leave besides: a stale git index lock, a half-made copy of a FRESH build
    (build / ".git" / "index.lock").touch()
    (root / "build" / ".t.new").mkdir()

    res = _run(root)
    assert res.returncode == 0, res.stderr
    assert "resuming build/t" in res.stdout
    assert not (root / "build" / ".t.new").exists()
    # the finished run: its stage skipped, its files untouched, one MLflow run
    assert f"Stage 'train@{done.replace('-s', '-')}' didn't change, skipping" in res.stdout
    assert _train_files(build, done) == kept
    assert _run_ids(root, done) == [_run_json(build, done)]
    # the victim: continued from its checkpoint in the same MLflow run, every round logged once
    lines = [line.split() for line in res.stderr.splitlines()]
    shown = [int(w[2].split("/")[0]) for w in lines if w[:2] == [f"{victim}:", "round"]]
    assert shown and min(shown) > ckpt_round and max(shown) == ROUNDS, shown  # (every 2nd round)
    assert _run_ids(root, victim) == [victim_id] == [_run_json(build, victim)]
    history = _mlflow(root).get_metric_history(victim_id, "global/accuracy")
    assert sorted(m.step for m in history) == list(range(1, ROUNDS + 1))
    assert all(m.timestamp <= killed_ms for m in history if m.step <= ckpt_round)
    assert _mlflow(root).get_run(victim_id).info.status == "FINISHED"
    assert not sidecar.exists()
    resumed = {run: _numbers(build, run) for run in (done, victim)}
    ids = {run: _run_json(build, run) for run in (done, victim)}

    # changed code: refused with one line, the build untouched; KEEP_CODE=1 finishes it as it is
    with (root / "src" / "fedcomm" / "paths.py").open("a") as f:
        f.write("# an edit after the build started\n")
    res = _run(root)
    assert res.returncode == 2
    assert res.stderr.splitlines()[0] == (
        "error: build/t was started with other code (changed since: src/fedcomm/paths.py): "
        "rerun with FRESH=1 to start afresh with this code, or with KEEP_CODE=1 to finish with "
        "the code it started with"
    )
    assert _train_files(build, done) == kept
    res = _run(root, "KEEP_CODE=1")
    assert res.returncode == 0, res.stderr
    assert "Data and pipelines are up to date." in res.stdout

    # FRESH=1: everything again, in new MLflow runs, to the numbers of the resumed build; the
    # MLflow run an interrupted stage left RUNNING is marked FAILED
    stray = _mlflow(root).create_run(_mlflow(root).get_experiment_by_name("resume").experiment_id)
    (build / ".fedcomm" / "checkpoints" / "gone-s0").mkdir(parents=True)
    (build / ".fedcomm" / "checkpoints" / "gone-s0" / "mlflow_run_id").write_text(stray.info.run_id)
    res = _run(root, "FRESH=1")
    assert res.returncode == 0, res.stderr
    assert "FRESH=1: starting build/t afresh" in res.stdout
    stray_run = _mlflow(root).get_run(stray.info.run_id)
    assert stray_run.info.status == "FAILED"
    assert "FRESH=1" in stray_run.data.tags["fedcomm.stopped"]
    for run in (done, victim):
        assert _run_json(build, run) != ids[run]
        assert len(_run_ids(root, run)) == 2
        assert _same(_numbers(build, run), resumed[run]), f"{run}: resumed != uninterrupted"


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["NAME=../t"], "error: NAME: '../t' is not a build name (allowed: letters, digits"),
        (
            ["PROFILE=nope.yaml"],
            "error: PROFILE: nope.yaml: no such file (NAME=x runs pipeline/reproductions/x.yaml, ",
        ),
        (["FRESH=yes"], "error: FRESH: 'yes' (allowed: 1, 0 or unset)"),
        (["FRESH=1", "KEEP_CODE=1"], "error: FRESH=1 and KEEP_CODE=1 exclude each other"),
    ],
)
def test_bad_arguments_end_with_one_line(tmp_path: Path, args: list[str], error: str) -> None:
    root = _project(tmp_path)
    res = _run(root, *args)
    assert res.returncode == 2
    assert res.stderr.splitlines()[0].startswith(error), res.stderr
    assert not (root / "build" / "t").exists()


def test_a_second_make_reproduce_of_the_same_build_is_refused(tmp_path: Path) -> None:
    root = _project(tmp_path)
    (root / "build").mkdir()
    with (root / "build" / ".t.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as a running `make reproduce NAME=t` holds it
        res = _run(root)
    assert res.returncode == 2
    assert res.stderr.splitlines()[0] == (
        "error: build/t: another `make reproduce NAME=t` is running"
    )
    assert not (root / "build" / "t").exists()


def test_dvc_locks_of_dead_processes_are_cleared_and_a_live_dvc_is_refused(tmp_path: Path) -> None:
    """DVC's rwlock lists the dvc processes working in a build. A killed one's PID stays there;
    DVC refuses to run while that PID looks alive (unreaped, or reused after a reboot): here
    this test's own PID, alive but not working in the build. A live process in the build is."""
    root = _project(tmp_path)
    build = root / "build" / "t"
    (build / ".dvc" / "tmp").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(build)], check=True)
    shutil.copy(root / "t.yaml", build / "params.yaml")
    shutil.copy(root / "dvc.yaml", build / "dvc.yaml")
    rwlock = build / ".dvc" / "tmp" / "rwlock"

    def lock(pid: int) -> None:
        info = {"pid": pid, "cmd": "dvc repro"}
        rwlock.write_text(json.dumps({"read": {"src": [info]}, "write": {"runs": info}}))

    lock(os.getpid())
    res = _run(root)
    assert f"cleared DVC's lock left by the killed dvc process(es) {os.getpid()}" in res.stdout
    assert not rwlock.exists()
    # (then the rest of this make-believe build is refused: it lacks the project's code)
    assert res.returncode == 2 and "was started with other code" in res.stderr

    with subprocess.Popen(["sleep", "60"], cwd=build) as live:
        lock(live.pid)
        res = _run(root)
        live.kill()
    assert res.returncode == 2
    assert res.stderr.splitlines()[0] == (
        f"error: build/t: dvc (PID {live.pid}) is running in it; wait for it or stop it"
    )
    assert rwlock.exists()
