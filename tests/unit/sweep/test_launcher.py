"""The submitit launcher's options: what a lab's flags become on Slurm, and bad values named.
(The launcher running trials as array tasks: tests/pipeline/test_sweep_submitit.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.errors import InputError
from fedcomm.sweep.launcher import Cluster, executor


def test_slurm_options_reach_the_job_arrays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sbatch script submitit would submit for an array of 40 trials (rendered, not run:
    submitit only needs an ``srun`` on PATH to build its Slurm executor)."""
    from submitit.slurm.slurm import _make_sbatch_string

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    where = Cluster(
        "slurm", None, parallel=16, timeout_min=120, partition="gpu", cpus_per_task=4,
        gpus_per_task=1, mem_gb=32, slurm={"account": "lab", "qos": "normal"},
    )  # fmt: skip
    ex = executor(where, tmp_path / "jobs")
    assert ex.cluster == "slurm"
    script = _make_sbatch_string("python -m task", tmp_path / "jobs", map_count=40,
                                 **ex._executor.parameters)  # fmt: skip
    for line in ("--array=0-39%16", "--time=120", "--partition=gpu", "--cpus-per-task=4",
                 "--gpus-per-node=1", "--mem=32GB", "--account=lab", "--qos=normal"):  # fmt: skip
        assert f"#SBATCH {line}" in script, (line, script)


def test_local_cluster_runs_tasks_here(tmp_path: Path) -> None:
    assert executor(Cluster("local"), tmp_path).cluster == "local"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"cluster": "pbs"}, "--cluster: 'pbs' is not one of ['slurm', 'local', 'debug']"),
        ({"parallel": 0}, "--parallel: must be >= 1"),
        ({"timeout_min": 0}, "--timeout-min: must be >= 1"),
    ],
)
def test_bad_options_are_named(kw: dict[str, object], message: str) -> None:
    with pytest.raises(InputError) as err:
        Cluster(**kw)  # type: ignore[arg-type]
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--launcher", "pbs"], "error: --launcher: 'pbs' is not one of ['local', 'submitit']"),
        (
            ["--launcher", "submitit", "--slurm", "account"],
            "error: --slurm: 'account' is not KEY=VALUE",
        ),
    ],
)
def test_bad_launcher_flags_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["sweep", str(tmp_path / "space.yaml"), *args])
    assert res.exit_code == 2 and message in res.output
