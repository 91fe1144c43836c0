"""Search-space files: every shipped space validates; bad ranges and keys are rejected by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fedcomm.config import ConfigError
from fedcomm.sweep.space import apply, load_sweep, trial_params
from tests.conftest import REPO, tiny_params

SPACES = sorted((REPO / "pipeline" / "search_spaces").glob("*.yaml"))


def write(tmp: Path, space: dict[str, Any], base: dict[str, Any] | None = None) -> Path:
    raw = base or tiny_params(**{"algorithms.fedsparse": {"name": "fedsparse"}})
    (tmp / "base.yaml").write_text(yaml.safe_dump(raw))
    doc = {"base": "base.yaml", "run": "fedsparse", "trials": 3, **space}
    path = tmp / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def space_with(dist: dict[str, Any], key: str = "algorithms.fedsparse.lambda0") -> dict[str, Any]:
    return {"space": {key: dist}}


@pytest.mark.parametrize("path", SPACES, ids=[p.stem for p in SPACES])
def test_shipped_spaces_validate_against_params_yaml(path: Path) -> None:
    sweep, base_raw = load_sweep(path, REPO)
    assert sweep.study == path.stem
    assert sweep.run in base_raw["algorithms"]
    for key, dist in sweep.space.items():  # every corner is a valid params file
        for value in dist.corners():
            trial_params(sweep, base_raw, {key: value})


def test_at_least_one_space_per_swept_algorithm() -> None:
    runs = {load_sweep(p, REPO)[0].run for p in SPACES}
    assert {"fedsparse", "feddst", "fedbiad", "fedl1"} <= runs


@pytest.mark.parametrize(
    ("dist", "message"),
    [
        ({"type": "float", "low": 1e-3, "high": 1e-5}, "low=0.001 must be < high=1e-05"),
        ({"type": "float", "low": 0.0, "high": 1e-3, "log": True}, "log=true needs low > 0"),
        ({"type": "float", "low": 0.1, "high": 0.1}, "must be < high"),
        ({"type": "int", "low": 5, "high": 2}, "low=5 must be < high=2"),
        ({"type": "categorical", "choices": []}, "choices"),
        ({"type": "normal", "low": 0, "high": 1}, "type"),
        ({"type": "float", "low": 0.0, "high": 1.0, "step": 2.0}, "step=2.0 exceeds"),
    ],
)
def test_bad_ranges_are_rejected_by_key(tmp_path: Path, dist: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_sweep(write(tmp_path, space_with(dist)), tmp_path)
    text = str(err.value)
    assert "algorithms.fedsparse.lambda0" in text and message in text, text


def test_a_bound_the_params_reject_is_named(tmp_path: Path) -> None:
    # lambda0 must be >= 0: the low corner fails params validation
    path = write(tmp_path, space_with({"type": "float", "low": -1.0, "high": 1.0}))
    with pytest.raises(
        ConfigError, match=r"space\.algorithms\.fedsparse\.lambda0: the value -1\.0"
    ):
        load_sweep(path, tmp_path)


def test_unknown_key_lists_the_neighbours(tmp_path: Path) -> None:
    path = write(
        tmp_path, space_with({"type": "float", "low": 0.1, "high": 1.0}, "train.local.lrr")
    )
    with pytest.raises(ConfigError, match=r"space\.train\.local\.lrr: no such params key") as err:
        load_sweep(path, tmp_path)
    assert "lr" in str(err.value) and "batch_size" in str(err.value)


def test_experiment_keys_are_reserved(tmp_path: Path) -> None:
    path = write(tmp_path, space_with({"type": "categorical", "choices": [0]}, "experiment.seeds"))
    with pytest.raises(ConfigError, match="`experiment` is set by the sweep itself"):
        load_sweep(path, tmp_path)


def test_other_algorithms_keys_and_float_on_int_are_rejected(tmp_path: Path) -> None:
    other = space_with({"type": "float", "low": 0.1, "high": 1.0}, "algorithms.fedprox.mu")
    with pytest.raises(ConfigError, match=r"only `algorithms\.fedsparse\.\*` reaches"):
        load_sweep(write(tmp_path, other), tmp_path)
    epochs = space_with({"type": "float", "low": 1, "high": 3}, "train.local.epochs")
    with pytest.raises(ConfigError, match="a float distribution on an integer key"):
        load_sweep(write(tmp_path, epochs), tmp_path)
    step = space_with({"type": "int", "low": 1, "high": 3, "step": 5}, "train.local.epochs")
    with pytest.raises(ConfigError, match="step=5 exceeds"):
        load_sweep(write(tmp_path, step), tmp_path)


def test_unknown_run_and_bad_objective_are_named(tmp_path: Path) -> None:
    ok = space_with({"type": "float", "low": 1e-6, "high": 1e-3, "log": True})
    with pytest.raises(ConfigError, match="run='fedsparce' is not a key"):
        load_sweep(write(tmp_path, {**ok, "run": "fedsparce"}), tmp_path)
    with pytest.raises(ConfigError, match="needs budget_gib"):
        load_sweep(write(tmp_path, {**ok, "objective": {"reduce": "at_budget"}}), tmp_path)
    multi_pruned = {**ok, "objective": {"kind": "multi"}, "pruner": {"name": "median"}}
    with pytest.raises(ConfigError, match="multi-objective studies cannot prune"):
        load_sweep(write(tmp_path, multi_pruned), tmp_path)
    with pytest.raises(ConfigError, match="seeds has duplicates"):
        load_sweep(write(tmp_path, {**ok, "seeds": [1, 1]}), tmp_path)
    with pytest.raises(ConfigError, match="no such file"):
        load_sweep(tmp_path / "missing.yaml", tmp_path)


def test_apply_sets_dotted_keys_without_touching_the_base() -> None:
    base = tiny_params()
    out = apply(base, {"train.local.lr": 0.3, "algorithms.fedprox.mu": 0.5})
    assert out["train"]["local"]["lr"] == 0.3 and out["algorithms"]["fedprox"]["mu"] == 0.5
    assert base["train"]["local"]["lr"] == 0.05


def test_fingerprint_changes_with_space_and_base_not_with_trials(tmp_path: Path) -> None:
    ok = space_with({"type": "float", "low": 1e-6, "high": 1e-3, "log": True})
    a, base = load_sweep(write(tmp_path, ok), tmp_path)
    b, _ = load_sweep(write(tmp_path, {**ok, "trials": 9}), tmp_path)
    assert a.fingerprint(base) == b.fingerprint(base)
    c, _ = load_sweep(write(tmp_path, {**ok, "seeds": [0, 1]}), tmp_path)
    assert c.fingerprint(base) != a.fingerprint(base)
    assert a.fingerprint({**base, "train": {"rounds": 9}}) != a.fingerprint(base)


def test_every_problem_of_a_space_is_reported_at_once(tmp_path: Path) -> None:
    space = {
        "space": {
            "algorithms.fedsparse.lambda0": {"type": "float", "low": 1e-3, "high": 1e-5},
            "train.local.lrr": {"type": "float", "low": 0.1, "high": 1.0},
            "experiment.seeds": {"type": "categorical", "choices": [0]},
        },
        "seeds": [1, 1],
    }
    with pytest.raises(ConfigError) as err:
        load_sweep(write(tmp_path, space), tmp_path)
    text = str(err.value)
    assert "4 invalid value(s)" in text, text
    for fragment in (
        "low=0.001 must be < high=1e-05",
        "space.train.local.lrr: no such params key",
        "space.experiment.seeds: `experiment` is set by the sweep itself",
        "seeds has duplicates",
    ):
        assert fragment in text, (fragment, text)
