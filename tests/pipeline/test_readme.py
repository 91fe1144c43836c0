"""Every command in the README's bash blocks runs as written, or is listed below with the reason
it is not run here (and where it is tested instead): the README cannot rot silently.

The cheap ones run in a temporary git + DVC copy of the project on the tiny profile, with the
keys the README's commands assume of params.yaml (`dvc exp run -S` only sets existing keys):
`algorithms.fedprox.mu`, `train.backend` and the MLflow experiment `fedcomm`."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from fedcomm.config import validate_params
from fedcomm.experiment import check_experiment
from tests.conftest import REPO
from tests.pipeline._repo import build_repo, commit, shell_env

pytestmark = pytest.mark.slow

NOT_RUN = {  # command prefix -> why it is not run by this test
    "make repro": "the install + `dvc repro` of params.yaml: what .ci/run and this test's repo do",
    "make test": "the test suite itself (.ci/run)",
    "make reproduce": "hours; each reproduction's page gives its numbers",
    "mlflow ui": "a long-running server",
    "fedcomm sweep": "an Optuna study: tests/pipeline/test_sweep.py and test_dvc_sweep.py",
    "dvc exp run --queue": "tests/pipeline/test_dvc_pipeline.py queues one; its -S values are "
    "checked against params.yaml below",
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
    return command.split()[0] in ("dvc", "fedcomm")


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
    raw["algorithms"]["fedprox"] = {"name": "fedprox", "mu": 0.01}
    raw["tracking"]["experiment"] = "fedcomm"
    raw["train"]["backend"] = "sequential"  # as params.yaml (`dvc exp run -S` needs the key)
    return build_repo(tmp_path_factory.mktemp("readme"), yaml.safe_dump(raw))


def test_the_readme_commands_run_as_written(repo: Path) -> None:
    commit(repo, "repro")
    ran = []
    for command in readme_commands():
        if command.startswith(tuple(NOT_RUN)) or not _runnable(command):
            continue
        res = subprocess.run(
            command, shell=True, cwd=repo, env=shell_env(), capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        assert res.returncode == 0, f"{command}\n{res.stdout}\n{res.stderr}"
        ran.append(command.split()[:3])
    assert ["fedcomm", "report", "-e"] in ran and ["dvc", "exp", "run"] in ran
    assert (repo / "reports" / "compare" / "summary.md").is_file()  # `fedcomm report`'s output
