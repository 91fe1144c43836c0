"""Contract tests over EVERY registered algorithm (optax `_common_test` style).

Each algorithm, built from its default config, must: run two deterministic rounds (same seed,
same numbers), round-trip its state through a checkpoint (resume = uninterrupted), account
every message in the ledger exactly as its payload's size, and keep the client data untouched.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.models import build_model
from fedcomm.simulation import checkpoint, loop
from fedcomm.simulation.data import FederatedTensors
from tests.conftest import digits_federation

TIME_KEYS = ("time/",)


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _model(fed: FederatedTensors) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=fed.input_shape, num_classes=fed.num_classes, hidden=[16])


def _cfg(rounds: int = 2) -> loop.LoopConfig:
    return loop.LoopConfig(
        rounds=rounds,
        clients_per_round=3,
        local=LocalConfig(epochs=1, batch_size=16, lr=0.05),
        seed=7,
        checkpoint_every=1,
    )


def _run(
    name: str,
    fed: FederatedTensors,
    ckpt: Path | None = None,
    resume: bool = False,
    **cfg_kw: object,
) -> loop.RunResult:
    alg = build_algorithm(CONFIGS[name](**cfg_kw))  # type: ignore[arg-type]
    return loop.run(
        _cfg(),
        alg,
        _model(fed),
        fed,
        build_compressor("none"),
        config_hash="contract",
        checkpoint_path=ckpt,
        resume=resume,
    )


def _numbers(res: loop.RunResult) -> list[dict[str, object]]:
    return [
        {k: v for k, v in row.items() if not k.startswith(TIME_KEYS)}
        for row in res.state.round_rows
    ]


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


ALL = sorted(CONFIGS)


def test_registry_has_the_fedavg_family() -> None:
    assert {"fedavg", "fedprox"} <= set(ALL)


@pytest.mark.parametrize("name", ALL)
def test_default_config_validates_and_forbids_extras(name: str) -> None:
    cfg = CONFIGS[name]()
    assert cfg.name == name
    with pytest.raises(ValueError, match="Extra inputs"):
        CONFIGS[name](not_a_field=1)  # type: ignore[call-arg]


@pytest.mark.parametrize("name", ALL)
def test_two_rounds_are_deterministic(name: str, fed: FederatedTensors) -> None:
    a, b = _run(name, fed), _run(name, fed)
    assert _numbers(a) == _numbers(b)
    assert _same(a.final_params, b.final_params)
    assert a.ledger.rows == b.ledger.rows
    acc = a.state.round_rows[-1]["global/accuracy"]
    assert isinstance(acc, float) and 0.0 <= acc <= 1.0


@pytest.mark.parametrize("name", ALL)
def test_state_round_trips_through_checkpoint(
    name: str, fed: FederatedTensors, tmp_path: Path
) -> None:
    ckpt = tmp_path / "state.pt"
    full = _run(name, fed, ckpt=ckpt)  # saves after round 1 (not after the last round)
    saved = checkpoint.load(ckpt, "contract")
    assert saved is not None and saved.round_ == 1
    assert checkpoint.load(ckpt, "another-config") is None  # a different config never resumes
    resumed = _run(name, fed, ckpt=ckpt, resume=True)
    assert resumed.resumed_from == 1
    assert _numbers(resumed) == _numbers(full)
    assert _same(resumed.final_params, full.final_params)
    assert resumed.ledger.rows == full.ledger.rows


@pytest.mark.parametrize("name", ALL)
def test_every_message_is_in_the_ledger(name: str, fed: FederatedTensors) -> None:
    res = _run(name, fed)
    rows = res.ledger.frame()
    rounds = rows.filter(pl.col("round") > 0)
    per_round = rounds.group_by("round", "direction").len().sort("round", "direction")
    assert per_round["len"].to_list() == [3] * 4  # 3 clients, down + up, 2 rounds
    warm = rows.filter(pl.col("round") == 0)  # only a warm start (GraSP, PruneFL) sends then
    assert warm.height == 0 or build_algorithm(CONFIGS[name]()).warm_start is not None
    total = int((rows["payload_bits"] + rows["index_bits"] + rows["meta_bits"]).sum())
    assert math.isclose(res.state.round_rows[-1]["comm/cum_bytes"], total / 8)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ALL)
def test_client_data_is_not_mutated(name: str, fed: FederatedTensors) -> None:
    before = [d.x.clone() for d in fed.train]
    _run(name, fed)
    assert all(torch.equal(a, d.x) for a, d in zip(before, fed.train, strict=True))


def test_fedprox_with_mu_zero_equals_fedavg(fed: FederatedTensors) -> None:
    avg, prox = _run("fedavg", fed), _run("fedprox", fed, mu=0.0)
    assert _same(avg.final_params, prox.final_params)
    assert _numbers(avg) == _numbers(prox)


def test_fedprox_with_mu_differs_from_fedavg(fed: FederatedTensors) -> None:
    avg, prox = _run("fedavg", fed), _run("fedprox", fed, mu=1.0)
    assert not _same(avg.final_params, prox.final_params)


def test_fedavg_dense_messages_cost_32_bits_per_parameter(fed: FederatedTensors) -> None:
    res = _run("fedavg", fed)
    numel = sum(p.numel() for p in _model(fed).parameters())
    frame = res.ledger.frame()
    assert set(frame["payload_bits"].to_list()) == {32 * numel}
    assert set(frame["index_bits"].to_list()) == {0}
    assert np.all(frame["dense_bits"].to_numpy() == frame["payload_bits"].to_numpy())


def test_local_accuracy_measures_what_was_uploaded(fed: FederatedTensors) -> None:
    """With a lossy uplink compressor, local accuracy evaluates the model the server received
    (here: a compressor that drops the whole update, so the upload is the broadcast model)."""
    from fedcomm.comm.codecs import Compressor, encode_dense
    from fedcomm.evaluation.metrics import evaluate

    def drop(payload, state, gen, round_):  # type: ignore[no-untyped-def]
        return encode_dense({k: torch.zeros_like(v) for k, v in payload.decode().items()}), state

    cfg = loop.LoopConfig(rounds=1, clients_per_round=3, local=LocalConfig(lr=0.5), seed=7)
    model = _model(fed)
    init = {k: v.detach().clone() for k, v in model.named_parameters()}
    alg = build_algorithm(CONFIGS["fedavg"]())
    res = loop.run(cfg, alg, model, fed, Compressor("drop", lambda: None, drop), config_hash="x")
    for row in res.state.client_rows:
        test = fed.test[row["client_id"]]
        assert row["local_accuracy"] == evaluate(model, init, test.x, test.y).accuracy
    assert _same(res.final_params, init)  # nothing arrived, nothing moved
