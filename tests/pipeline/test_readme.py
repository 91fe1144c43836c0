"""Every command in the README's bash blocks runs as written, or is listed below with the reason
it is not run here (and where it is tested instead): the README cannot rot silently.

They run as a new user types them after `make repro`: in order, in one new `bash` whose
environment has no virtualenv on PATH, no VIRTUAL_ENV and no PYTHONPATH, so that only what the
README says (`source .venv/bin/activate`) makes `dvc`, `mlflow`, `fedcomm` and the stages' `python`
the project's. The repo is a temporary git + DVC copy of the project on the tiny profile (two of
its runs), with the keys the README's commands assume of params.yaml (`dvc exp run -S` only sets
existing keys): `algorithms.fedprox.mu`, `train.backend` and the MLflow experiment `fedcomm`; its
`.venv` is the virtualenv running the tests. A stage started by a `python` without the project's
packages ends with one line that says to activate it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedcomm.config import validate_params
from fedcomm.stages.train import check_experiment
from tests.conftest import REPO
from tests.pipeline._repo import COPY, build_repo, commit

pytestmark = pytest.mark.slow

NOT_RUN = {  # command prefix -> why it is not run by this test
    "make repro": "the install + `dvc repro` of params.yaml: what .ci/run and this test's repo do",
    "make test": "the test suite itself (.ci/run)",
    "make reproduce": "hours; tests/pipeline/test_reproduce_resume.py runs it on a tiny profile "
    "(killed, resumed, FRESH=1); each reproduction's page gives its numbers",
    "fedcomm sweep": "an Optuna study: tests/pipeline/test_sweep.py and test_dvc_sweep.py; "
    "--launcher submitit: tests/pipeline/test_sweep_submitit.py (submitit's local executor)",
    "pip install -e '.[postgres,cluster]'": "the Slurm example's install on a cluster's login "
    "node; .ci/run installs .[dev], which holds both extras",
    "export FEDCOMM_DATA_ROOT=/shared/datasets": "the Slurm example's environment (a cluster's "
    "shared paths and tracking server)",
    "dvc exp run --queue": "tests/pipeline/test_dvc_pipeline.py queues one; its -S values are "
    "checked against params.yaml below",
    "fedcomm verdicts": "reads docs/reproductions/ (not in this repo copy): "
    "tests/unit/reporting/test_reproductions_readme.py runs --check on the real page, "
    "tests/unit/reporting/test_verdict.py the --write / --check round trip",
    "fedcomm curves": "needs a finished build: tests/unit/reporting/test_verdict_curves.py runs "
    "it on a tiny one",
    "bash pipeline/per_seed.sh": "one build per seed, hours: tests/pipeline/test_per_seed.py runs "
    "it dry and checks the params it writes",
    "fedcomm ui": "a server until Ctrl-C: tests/unit/tracking/test_mlflow_ui.py starts it and "
    "follows its link in headless Chromium",
    "optuna-dashboard": "a server on a sweep's study: tests/unit/sweep/test_dashboard.py starts "
    "it on a real study and reads its API",
}


def readme_commands() -> list[str]:
    """The command lines of the README's ```bash blocks, trailing comments removed."""
    text = (REPO / "README.md").read_text()
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            command = re.split(r"\s{2,}#", line)[0].strip()
            if command and not command.startswith("#"):
                out.append(command)
    return out


def test_every_readme_command_is_run_or_accounted_for() -> None:
    commands = readme_commands()
    assert len(commands) >= 10
    unknown = [c for c in commands if not c.startswith(tuple(NOT_RUN)) and not _runnable(c)]
    assert unknown == [], f"README commands neither run nor listed in NOT_RUN: {unknown}"


def _runnable(command: str) -> bool:
    return command.startswith(("dvc ", "fedcomm ", "source ", "mlflow ui "))


VENV = Path(sys.prefix)  # the virtualenv running the tests: the repo's `.venv`


def fresh_shell_env() -> dict[str, str]:
    """What a new shell has: the user's basics, and a PATH without any virtualenv on it (no
    VIRTUAL_ENV, PYTHONPATH, MLFLOW_TRACKING_URI, FEDCOMM_* either)."""
    keep = ("HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TERM", "TMPDIR", "SHELL")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    venv_bins = {(VENV / "bin").resolve(), Path(sys.executable).parent.resolve()}
    path = [
        p
        for p in os.environ["PATH"].split(os.pathsep)
        if p and Path(p).resolve() not in venv_bins and not (Path(p).parent / "pyvenv.cfg").exists()
    ]
    env["PATH"] = os.pathsep.join(path)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# `mlflow ui` as written, on a free port (5000 may be taken), until /health answers; then stopped
UI = """{command} --port {port} >{log} 2>&1 &
ui=$!
python - {port} <<'PY' || {{ cat {log} >&2; fail {quoted}; }}
import sys, time, urllib.request
for _ in range(360):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{{sys.argv[1]}}/health", timeout=5)
        sys.exit(0)
    except OSError:
        time.sleep(0.5)
sys.exit("mlflow ui did not answer on /health")
PY
kill -- -$ui
echo {ran}
"""


def readme_script(commands: list[str], log: Path) -> str:
    """One bash script: the README's commands in order, each stopping the script with its own
    line if it fails; those in NOT_RUN left out."""
    lines = [
        "set -m",  # background jobs (mlflow ui) in their own process group
        'fail() { echo "README command failed: $1" >&2; exit 1; }',
        # the premise: this shell has not got the project's tools yet
        "! command -v fedcomm >/dev/null || fail 'the fresh shell already has fedcomm on PATH'",
    ]
    for command in commands:
        quoted, ran = shlex.quote(command), shlex.quote(f"ran: {command}")
        if command.startswith(tuple(NOT_RUN)) or not _runnable(command):
            continue
        if command.startswith("mlflow ui "):
            port = _free_port()
            lines.append(UI.format(command=command, port=port, log=log, quoted=quoted, ran=ran))
            continue
        lines.append(f"{{ {command}\n}} || fail {quoted}\necho {ran}")
    return "\n".join(lines) + "\n"


def test_the_queue_example_values_fit_the_default_params() -> None:
    """`dvc exp run --queue -S 'key=a,b'`: each value applied to params.yaml must pass the data
    checks of `fedcomm config validate` (alpha 0.1 once failed min_partition_size)."""
    queued = [c for c in readme_commands() if c.startswith("dvc exp run --queue")]
    assert queued
    for command in queued:
        args = shlex.split(command.split("&&")[0])
        for arg in (args[i + 1] for i, a in enumerate(args) if a == "-S"):
            key, values = arg.split("=", 1)
            for value in values.split(","):
                raw = yaml.safe_load((REPO / "params.yaml").read_text())
                node = raw
                *parents, leaf = key.split(".")
                for p in parents:
                    node = node[p]
                node[leaf] = yaml.safe_load(value)
                check_experiment(validate_params(raw))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    raw = yaml.safe_load((REPO / "pipeline" / "profiles" / "tiny.yaml").read_text())
    # two runs (the commands need none in particular): each `dvc exp run` below runs 5 stage
    # processes instead of 7
    raw["experiment"]["runs"] = ["fedavg", "fedsparse"]
    raw["algorithms"]["fedprox"] = {"name": "fedprox", "mu": 0.01}
    raw["tracking"]["experiment"] = "fedcomm"
    raw["train"]["backend"] = "sequential"  # as params.yaml (`dvc exp run -S` needs the key)
    root = build_repo(tmp_path_factory.mktemp("readme"), yaml.safe_dump(raw))  # as `make repro`
    (root / ".venv").symlink_to(VENV, target_is_directory=True)
    with (root / ".git" / "info" / "exclude").open("a") as f:
        f.write(".venv\n")  # (a link: the `.venv/` of .gitignore matches folders only)
    return root


def test_the_readme_commands_run_as_written_from_a_fresh_shell(repo: Path, tmp_path: Path) -> None:
    commit(repo, "repro")
    script = readme_script(readme_commands(), tmp_path / "mlflow-ui.log")
    proc = subprocess.Popen(
        ["bash", "--noprofile", "--norc", "-c", script], cwd=repo, env=fresh_shell_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
    ran = [line.removeprefix("ran: ") for line in out.splitlines() if line.startswith("ran: ")]
    assert ran == [
        c for c in readme_commands() if _runnable(c) and not c.startswith(tuple(NOT_RUN))
    ]
    assert ran[0] == "source .venv/bin/activate"  # the first thing the README has a user do
    assert any(c.startswith("mlflow ui ") for c in ran)
    assert (repo / "reports" / "compare" / "summary.md").is_file()  # `fedcomm report`'s output


def test_a_stage_outside_the_virtualenv_ends_with_one_line(tmp_path: Path) -> None:
    """`python` without the project's packages (here: site-packages switched off with -S)."""
    for script in sorted((REPO / "stages").glob("[!_]*.py")):
        res = subprocess.run(
            [sys.executable, "-S", str(script)], cwd=tmp_path, capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert res.returncode == 2, res.stderr
        assert res.stderr.count("\n") == 1, res.stderr
        assert res.stderr.startswith(f"error: stages/{script.name}: {sys.executable} cannot ")
        assert "`source .venv/bin/activate`" in res.stderr
    assert list(tmp_path.iterdir()) == []


def test_dvc_without_activating_stops_the_stage_with_that_line(tmp_path: Path) -> None:
    """The README's user who skips `source .venv/bin/activate` and calls `.venv/bin/dvc`: the
    stage's `python` is the shell's, without the project's packages (here a `python` that runs
    this interpreter with site-packages switched off)."""
    for name in COPY:
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / ".dvc").mkdir()
    shutil.copy(REPO / ".dvc" / "config", tmp_path / ".dvc" / "config")
    shutil.copy(REPO / "pipeline" / "profiles" / "tiny.yaml", tmp_path / "params.yaml")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    commit(tmp_path, "init")
    bare = tmp_path / "bare-python"
    bare.mkdir()
    (bare / "python").write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    (bare / "python").chmod(0o755)
    env = fresh_shell_env()
    env["PATH"] = f"{bare}{os.pathsep}{env['PATH']}"
    res = subprocess.run(
        [str(VENV / "bin" / "dvc"), "repro", "partition"], cwd=tmp_path, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode != 0
    output = res.stdout + res.stderr
    assert "error: stages/partition.py: " in output and "`source .venv/bin/activate`" in output
    assert "Traceback" not in output and "ModuleNotFoundError" not in output
