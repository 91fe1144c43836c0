"""Ctrl-C (SIGINT) on the real command, as a user sends it (issue 42, item 5).

Whenever it comes, the command ends with exit status 130 and ONE line on stderr that starts
``interrupted`` and says what rerunning the same command does, and no traceback: in ``train``'s
rounds the line names the round and the checkpoint kept (``interrupted at round N; the
checkpoint of round M is kept; rerun the same command to resume``), a rerun says in one line
that it resumes and from which round, and the MLflow run ends ``KILLED`` (the one run, resumed
by the rerun); a second Ctrl-C while the first is handled changes nothing; during start-up (a
stage script's imports of torch & co. take seconds) the line is ``interrupted while starting``;
in a sweep's trial it is the sweep's (and Optuna logs no traceback of the trial). The signal is
sent once the process says (on stderr) that it got that far: a progress line, or ``python -X
importtime``'s line for a module just imported; for the sweep, once its trial's first checkpoint
is on disk."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import yaml
from mlflow.tracking import MlflowClient

from tests.conftest import tiny_params
from tests.unit.simulation.test_resume import _fedcomm, _runs

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
ROUNDS = 100  # far more than a test waits for: every run here is interrupted
CKPT = Path(".fedcomm") / "checkpoints" / "fedavg-s0" / "state.pt"
KEPT = re.compile(
    r"interrupted at round (\d+); the checkpoint of round (\d+) is kept; "
    r"rerun the same command to resume"
)
STARTING = "interrupted while starting; rerun the same command"
FRESH = "no checkpoint yet; a rerun starts at round 1"
NOISE = re.compile(r"fedavg-s0: round \d+/\d+ |.* INFO mlflow\.|import time:|\[I ")  # not ours


def _project(root: Path, checkpoint_every: int) -> Path:
    root.mkdir()
    params = tiny_params(**{"train.rounds": ROUNDS, "train.checkpoint_every": checkpoint_every})
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    assert _fedcomm(root, "partition").returncode == 0
    return root


def _spawn(cwd: Path, argv: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "FEDCOMM_PROJECT_ROOT": str(cwd), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _said(proc: subprocess.Popen[str], before: list[str]) -> tuple[int, list[str]]:
    """Its exit status and the lines it said (``NOISE`` left out: progress, MLflow's and Optuna's
    logs, import times) once it ends; no traceback, then or ``before``."""
    out, err = proc.communicate(timeout=300)
    assert "Traceback" not in out + err + "\n".join(before), (before, out, err)
    return proc.returncode, [line for line in (out + err).splitlines() if not NOISE.match(line)]


def _interrupt(
    cwd: Path, argv: list[str], when: Callable[[str], bool], times: int = 1
) -> tuple[int, list[str], list[str]]:
    """Run ``argv`` in ``cwd``, send SIGINT ``times`` once a stderr line satisfies ``when``;
    its exit status, its stderr lines up to then, and the lines it said (:func:`_said`)."""
    proc = _spawn(cwd, argv)
    assert proc.stderr is not None
    before = []
    for line in proc.stderr:
        before.append(line.rstrip("\n"))
        if when(line):
            for _ in range(times):
                proc.send_signal(signal.SIGINT)
            break
    status, said = _said(proc, before)
    return status, before, said


def _train(root: Path, times: int = 1) -> tuple[int, list[str], list[str]]:
    """``train`` interrupted once it reports a round (every tenth of the run, so the 10th first
    unless it resumed)."""
    argv = [sys.executable, "-m", "fedcomm.cli", "train", "--run", "fedavg"]
    return _interrupt(root, argv, lambda line: line.startswith("fedavg-s0: round "), times)


def _reported(before: list[str]) -> int:
    """The round of the progress line the signal waited for."""
    return int(before[-1].split()[2].split("/")[0])


def _said_kept(said: list[str]) -> tuple[int, int]:
    """The round and the checkpoint's round of ``said``, which must be the one line."""
    match = KEPT.fullmatch(said[0]) if len(said) == 1 else None
    assert match is not None, said
    return int(match[1]), int(match[2])


def _checkpoint_round(root: Path) -> int:
    return int(torch.load(root / CKPT, weights_only=False)["state"].round_)


def test_ctrl_c_in_a_round_names_it_and_the_rerun_resumes(tmp_path: Path) -> None:
    root = _project(tmp_path / "p", checkpoint_every=3)
    status, before, said = _train(root)
    assert status == 130
    n, kept = _said_kept(said)
    assert n >= _reported(before) and kept % 3 == 0 and n - 3 <= kept <= n
    assert _checkpoint_round(root) == kept  # what the line says is on disk
    assert not (root / "runs").exists()  # no outputs of an unfinished run
    ((name, state, steps),) = _runs(root)
    assert (name, state) == ("fedavg-s0", "KILLED")
    assert steps == list(range(1, len(steps) + 1)) and len(steps) in (n - 1, n)  # n: if logged

    # the rerun resumes from that checkpoint and says so; two Ctrl-C at once: the same one line
    resumed = kept
    status, before, said = _train(root, times=2)
    assert before[0] == f"resuming fedavg-s0 from the checkpoint of round {kept} of {ROUNDS}", (
        before
    )
    assert [line for line in before if "resum" in line] == before[:1]
    assert status == 130
    n, kept = _said_kept(said)
    assert n >= _reported(before) > resumed and n - 3 <= kept == _checkpoint_round(root)
    ((name, state, steps),) = _runs(root)  # still one MLflow run: each round logged once
    assert (name, state) == ("fedavg-s0", "KILLED")
    assert steps == list(range(1, len(steps) + 1)) and len(steps) in (n - 1, n)


def test_ctrl_c_before_the_first_checkpoint_says_a_rerun_starts_at_round_1(
    tmp_path: Path,
) -> None:
    root = _project(tmp_path / "p", checkpoint_every=1000)  # only round 0's is ever saved
    for _ in range(2):  # and the rerun starts afresh, saying nothing of resuming
        status, before, said = _train(root)
        assert status == 130
        assert len(said) == 1, said
        assert re.fullmatch(r"interrupted at round \d+; " + FRESH, said[0]), said
        assert not [line for line in before if "resum" in line], before
        assert _checkpoint_round(root) == 0
    assert [(n, s) for n, s, _ in _runs(root)] == [("fedavg-s0", "KILLED")]  # round 0 kept its id


def _imported(module: str) -> Callable[[str], bool]:
    """``when``: ``python -X importtime`` reports ``module`` imported (its line comes once the
    import is done; the imports after it take seconds more)."""
    return lambda line: line.startswith("import time:") and line.split("|")[-1].strip() == module


STAGES = sorted(p.stem for p in (REPO / "stages").glob("[!_]*.py"))


@pytest.mark.parametrize("stage", STAGES)
def test_ctrl_c_while_a_stage_script_starts(tmp_path: Path, stage: str) -> None:
    """Right after the script's first import: the library, typer, torch are still to come."""
    argv = [sys.executable, "-X", "importtime", str(REPO / "stages" / f"{stage}.py")]
    status, _, said = _interrupt(tmp_path, argv, _imported("_entry"))
    assert (status, said) == (130, [STARTING])


def test_ctrl_c_while_the_command_starts(tmp_path: Path) -> None:
    fedcomm = Path(sys.executable).parent / "fedcomm"  # the console script
    argv = [sys.executable, "-X", "importtime", str(fedcomm), "train", "--run", "fedavg"]
    status, _, said = _interrupt(tmp_path, argv, _imported("typer"))
    assert (status, said) == (130, [STARTING])


def test_ctrl_c_in_a_verbs_own_imports(tmp_path: Path) -> None:
    """Once a verb runs, its line says what rerunning it does (here: torch & co. imported by the
    partition stage, the dataset not yet partitioned)."""
    root = tmp_path / "p"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump(tiny_params()))
    argv = [sys.executable, "-X", "importtime", str(REPO / "stages" / "partition.py")]
    status, _, said = _interrupt(root, argv, _imported("fedcomm.stages.partition"))
    assert (status, said) == (130, ["interrupted; rerun the same command to partition the dataset"])


def test_ctrl_c_in_a_sweeps_trial(tmp_path: Path) -> None:
    """Once a trial trains (its checkpoint of round 0 is on disk): the sweep's own line, and
    not Optuna's log of the trial the interrupt failed (with a traceback)."""
    base = tiny_params(**{"train.rounds": ROUNDS})
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    space = {
        "base": "base.yaml",
        "run": "fedavg",
        "trials": 2,
        "seeds": [0, 1],  # two: the seeds' runs nest under a trial run
        "space": {"train.local.lr": {"type": "float", "low": 0.02, "high": 0.3, "log": True}},
    }
    (tmp_path / "study.yaml").write_text(yaml.safe_dump(space))
    proc = _spawn(tmp_path, [sys.executable, "-m", "fedcomm.cli", "sweep", "study.yaml"])
    trials = tmp_path / ".fedcomm" / "sweeps" / "study" / "trials"
    while proc.poll() is None and not any(trials.glob("*/checkpoints/fedavg-s0/state.pt")):
        time.sleep(0.05)  # (waiting, not timing: its logs are a few lines, the pipe holds them)
    proc.send_signal(signal.SIGINT)
    status, said = _said(proc, [])
    assert (status, said) == (130, ["interrupted; rerun the same command to continue the study"])
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    kinds = {(r.data.tags.get("fedcomm.kind", "train"), r.info.status) for r in runs}
    assert {k for k, _ in kinds} == {"study", "trial", "train"}, kinds
    assert {s for _, s in kinds} == {"KILLED"}, kinds  # each ended KILLED, none FAILED
