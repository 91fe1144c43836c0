"""Divergence: a non-finite or exploding training loss, or a non-finite update, stops the run
with a message naming the round and the likely key (default), or leaves that client out
(``train.on_divergence: skip``); never a silent NaN run."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.cli import app
from fedcomm.comm.codecs import Compressor, build_compressor, encode_dense
from fedcomm.simulation import divergence, loop
from fedcomm.simulation.data import FederatedTensors
from tests.conftest import digits_federation, small_loop, tiny_params


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _run(fed: FederatedTensors, compressor: Compressor, **cfg: Any) -> loop.RunResult:
    model, lcfg = small_loop(fed, **cfg)
    alg = build_algorithm(CONFIGS["fedavg"]())
    return loop.run(lcfg, alg, model, fed, compressor, config_hash="divergence")


def _poison_every_other() -> Compressor:
    """An uplink 'compressor' that turns every second client's update into NaNs."""
    calls = [0]

    def encode(payload, state, gen, round_):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] % 2 == 0:
            return encode_dense(
                {k: torch.full_like(v, math.nan) for k, v in payload.decode().items()}
            ), state
        return payload, state

    return Compressor("poison", lambda: None, encode)


def test_the_rule_by_hand() -> None:
    ok = {"w": torch.ones(3)}
    assert divergence.diverged(2.3, ok, 1e6) is None
    assert divergence.diverged(None, ok, 1e6) is None  # an algorithm that reports no loss
    assert "nan" in str(divergence.diverged(math.nan, ok, 1e6))
    assert "inf" in str(divergence.diverged(math.inf, ok, 1e6))
    assert "limit 1e+06" in str(divergence.diverged(2e6, ok, 1e6))
    bad = {"w": torch.tensor([1.0, math.inf]), "n": torch.tensor([1, 2])}
    assert "update of w" in str(divergence.diverged(0.5, bad, 1e6))
    # NaN anywhere, the first bad tensor named; huge but finite values and empty tensors are fine
    nan = {"a": torch.zeros(0), "b": torch.ones(4), "c": torch.tensor([2.0, math.nan, -math.inf])}
    assert "update of c" in str(divergence.diverged(0.5, nan, 1e6))
    big = {"a": torch.full((3,), 3e38), "b": torch.full((2,), -3e38, dtype=torch.float64)}
    assert divergence.diverged(0.5, big, 1e6) is None
    assert divergence.diverged(0.5, {"a": torch.zeros(0), "n": torch.tensor([5])}, 1e6) is None


@pytest.mark.parametrize("backend", ["sequential", "vectorized"])
def test_an_exploding_lr_stops_at_round_one_naming_the_key(
    fed: FederatedTensors, backend: str
) -> None:
    with pytest.raises(
        divergence.DivergenceError,
        match=r"round 1: client \d+ diverged.*train\.local\.lr \(now 1e\+30\)",
    ):
        _run(fed, build_compressor("none"), lr=1e30, backend=backend)


def test_skip_leaves_diverged_clients_out_and_counts_them(fed: FederatedTensors) -> None:
    res = _run(fed, _poison_every_other(), on_divergence="skip")
    assert all(bool(torch.isfinite(v).all()) for v in res.final_params.values())
    counted = [r.get("train/diverged_clients") for r in res.state.round_rows]
    assert counted == [1.0, 2.0]  # calls 2 (round 1), 4 and 6 (round 2) were poisoned
    with pytest.raises(divergence.DivergenceError, match="non-finite value in its update"):
        _run(fed, _poison_every_other())  # the default stops


def test_skip_still_stops_when_every_client_diverged(fed: FederatedTensors) -> None:
    with pytest.raises(divergence.DivergenceError, match="every client diverged"):
        _run(fed, build_compressor("none"), lr=1e30, on_divergence="skip")


def test_the_cli_fails_clearly_and_marks_the_mlflow_run_failed(
    project: Path,
) -> None:
    raw = tiny_params(**{"train.rounds": 2, "train.local.lr": 1e30})
    (project / "params.yaml").write_text(yaml.safe_dump(raw))
    cli = CliRunner()
    assert cli.invoke(app, ["partition"]).exit_code == 0
    res = cli.invoke(app, ["train", "--run", "fedavg", "--seed", "0"])
    out = res.output.strip()  # (MLflow's own INFO lines about creating its store come first)
    assert res.exit_code == 2 and "Traceback" not in out, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert errors == [out.splitlines()[-1]], out
    assert errors[0].startswith("error: round 1: client") and "train.local.lr" in errors[0]
    with sqlite3.connect(project / "mlflow.db") as con:
        statuses = [s for (s,) in con.execute("select status from runs")]
    assert statuses == ["FAILED"]
    assert not (project / "runs" / "fedavg-s0" / "train" / "model.safetensors").exists()


def test_the_summary_flags_a_run_that_skipped_diverged_clients() -> None:
    import polars as pl

    from fedcomm.config import validate_params
    from fedcomm.stages.summarize import divergence_notes

    params = validate_params(tiny_params(**{"experiment.seeds": [0, 1]}))
    clean = pl.DataFrame({"round": [1, 2, 3]})
    hit = pl.DataFrame({"round": [1, 2, 3], "train/diverged_clients": [None, 2.0, 1.0]})
    notes = divergence_notes(params, {"fedavg": [clean, hit], "fedprox": [clean, clean]})
    assert notes == [
        "**diverged:** `fedavg` seed 1 left 3 diverged client update(s) out of 2 round(s), "
        "first in round 2 (train.on_divergence: skip); its numbers are not a clean run's"
    ]
