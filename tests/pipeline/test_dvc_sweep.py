"""The `sweep` DVC stage (pipeline/sweep/dvc.yaml) in a temporary git+DVC copy of the repo: off
in `dvc repro`, runnable by name, resumable by raising `trials`, and its `best_params.yaml`
applied by `dvc exp run`."""

from __future__ import annotations

import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml

from tests.conftest import REPO
from tests.pipeline._repo import COPY
from tests.pipeline._repo import sh as _sh

pytestmark = pytest.mark.slow
STAGE = "pipeline/sweep/dvc.yaml:sweep@fedsparse"


def _set_trials(root: Path, n: int) -> None:
    path = root / "pipeline" / "search_spaces" / "fedsparse.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["trials"] = n
    path.write_text(yaml.safe_dump(doc))


def test_sweep_stage_is_opt_in_resumable_and_applies(tmp_path: Path, data_root: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    for name in COPY:
        src = REPO / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, root / name)
    (root / ".dvc").mkdir()
    shutil.copy(REPO / ".dvc" / "config", root / ".dvc" / "config")
    tiny = yaml.safe_load((REPO / "pipeline" / "profiles" / "tiny.yaml").read_text())
    tiny["experiment"]["runs"] = ["fedsparse"]  # the swept run: `dvc exp run` trains it alone
    (root / "params.yaml").write_text(yaml.safe_dump(tiny))
    _set_trials(root, 2)  # the shipped FedSparse space on the tiny profile's fedsparse run
    git = ("git", "-c", "user.email=t@t", "-c", "user.name=t")
    _sh(root, "git", "init", "-q")
    _sh(root, *git, "add", "-A")
    _sh(root, *git, "commit", "-qm", "init")

    _sh(root, "dvc", "repro", STAGE)
    out = root / "reports" / "sweep" / "fedsparse"
    first = pl.read_parquet(out / "trials.parquet")
    assert first.height == 2 and set(first["state"]) == {"COMPLETE"}
    assert "didn't change" in _sh(root, "dvc", "repro", STAGE)

    _set_trials(root, 3)  # a changed dep: the stage re-runs and continues the same study
    _sh(root, "dvc", "repro", STAGE)
    more = pl.read_parquet(out / "trials.parquet")
    assert more.height == 3
    assert (
        more.head(2)
        .select("number", "value:final:global/accuracy")
        .equals(first.select("number", "value:final:global/accuracy"))
    )

    best = yaml.safe_load((out / "best_params.yaml").read_text())["params"]
    args = _sh(root, "fedcomm", "sweep-args", str(out / "best_params.yaml")).split()
    _sh(root, *git, "add", "-A")
    _sh(root, *git, "commit", "-qm", "sweep")
    exp = _sh(root, "dvc", "exp", "run", *args)  # the default pipeline, with the best values
    assert "summarize" in exp and "sweep" not in exp
    assert pl.read_parquet(out / "trials.parquet").height == 3
    applied = yaml.safe_load((root / "params.yaml").read_text())
    assert applied["algorithms"]["fedsparse"]["lambda0"] == best["algorithms.fedsparse.lambda0"]
    assert applied["train"]["local"]["lr"] == best["train.local.lr"]
    fedsparse = applied["algorithms"]["fedsparse"]
    assert fedsparse["prune_threshold"] == best["algorithms.fedsparse.prune_threshold"]
    assert (root / "runs" / "fedsparse-s0" / "metrics.json").is_file()
    # params.yaml (a dep of the sweep stage) changed, yet `dvc repro` leaves the sweep alone
    again = _sh(root, "dvc", "repro")
    assert "sweep" not in again and pl.read_parquet(out / "trials.parquet").height == 3
