"""pipeline/per_seed.sh: one build per seed, the partition seed following the seed (dry run)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROFILE = "pipeline/reproductions/fedsparse_mnist.yaml"


def _run(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The script in a copy of the project's pipeline folder (its params go under tmp/build/)."""
    if not (tmp / "pipeline").exists():
        shutil.copytree(ROOT / "pipeline", tmp / "pipeline")
    return subprocess.run(
        ["bash", "pipeline/per_seed.sh", *args],
        cwd=tmp,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "DRY_RUN": "1", **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_each_seed_gets_its_own_partition_and_build(tmp_path: Path) -> None:
    done = _run(tmp_path, PROFILE, "abl", "0", "3", RUNS="fedavg fedsparse_mid", ROUNDS="7")
    assert done.returncode == 0, done.stderr
    base = yaml.safe_load((ROOT / PROFILE).read_text())
    for seed in (0, 3):
        params = tmp_path / f"build/.per_seed/abl_r7_s{seed}.yaml"
        assert (
            f"make reproduce NAME=abl_r7_s{seed} PROFILE=build/.per_seed/abl_r7_s{seed}.yaml"
            in (done.stdout)
        )
        got = yaml.safe_load(params.read_text())
        assert got["partition"]["seed"] == seed
        assert got["experiment"]["seeds"] == [seed]
        assert got["experiment"]["runs"] == ["fedavg", "fedsparse_mid"]
        assert got["train"]["rounds"] == 7
        # everything else is the profile's
        for key in ("data", "model", "algorithms", "evaluate"):
            assert got.get(key) == base.get(key)
        assert {k: v for k, v in got["partition"].items() if k != "seed"} == {
            k: v for k, v in base["partition"].items() if k != "seed"
        }


def test_without_runs_or_rounds_the_profile_keeps_its_own(tmp_path: Path) -> None:
    done = _run(tmp_path, PROFILE, "full", "2")
    assert done.returncode == 0, done.stderr
    got = yaml.safe_load((tmp_path / "build/.per_seed/full_s2.yaml").read_text())
    base = yaml.safe_load((ROOT / PROFILE).read_text())
    assert got["experiment"]["runs"] == base["experiment"]["runs"]
    assert got["train"] == base["train"]
    assert got["partition"]["seed"] == 2


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        ((PROFILE, "x"), {}, "give at least one seed"),
        (("nope.yaml", "x", "0"), {}, "PROFILE: 'nope.yaml'"),
        ((PROFILE, "bad name", "0"), {}, "NAME: 'bad name'"),
        ((PROFILE, "x", "-1"), {}, "seed '-1'"),
        ((PROFILE, "x", "0"), {"ROUNDS": "0"}, "ROUNDS: '0'"),
        ((PROFILE, "x", "0"), {"COMMIT": "yes"}, "COMMIT: 'yes'"),
    ],
)
def test_bad_input_is_one_clear_error(
    tmp_path: Path, args: tuple[str, ...], env: dict[str, str], says: str
) -> None:
    done = _run(tmp_path, *args, **env)
    assert done.returncode == 2
    assert says in done.stderr
    assert not list(tmp_path.glob("build/.per_seed/*.yaml"))


def test_set_makes_a_variant_of_the_profile(tmp_path: Path) -> None:
    study = "pipeline/profiles/system_study.yaml"
    links = "train.system.links.up='{kind: constant, value: 1.04}'"
    done = _run(
        tmp_path, study, "v", "1", SET=f"train.system.policy.deadline_s=8 train.rounds=5 {links}"
    )
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "build/.per_seed/v_s1.yaml").read_text()
    assert "set train.system.policy.deadline_s=8 train.rounds=5" in text.splitlines()[0]
    assert yaml.safe_load(text)["train"]["system"]["links"]["up"] == {
        "kind": "constant",
        "value": 1.04,
    }
    got, base = yaml.safe_load(text), yaml.safe_load((ROOT / study).read_text())
    assert got["train"]["system"]["policy"]["deadline_s"] == 8 and got["train"]["rounds"] == 5
    assert got["partition"]["seed"] == 1 and got["experiment"]["seeds"] == [1]
    assert got["train"]["system"]["links"]["down"] == base["train"]["system"]["links"]["down"]
    assert got["model"] == base["model"]
    bad = _run(tmp_path, study, "v", "1", SET="nodots")
    assert bad.returncode != 0 and "is not key.path=value" in bad.stderr
