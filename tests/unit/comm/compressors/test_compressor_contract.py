"""Every compressor: pass-through of non-update entries, the config, and real loop runs
(deterministic, ledger bits = the codec's rule, residuals surviving a checkpoint)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any, get_args

import pytest
import torch
from tests.conftest import digits_federation, tiny_params

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import COMPRESSORS, build_compressor
from fedcomm.comm.compressors._common import keep_count
from fedcomm.comm.compressors.dgc import warmup_density
from fedcomm.comm.payload import Dense, Free, Mask, Meta, Payload, Sparse
from fedcomm.config import CompressorConfig, ConfigError, validate_params
from fedcomm.models import build_model
from fedcomm.simulation import checkpoint, loop
from fedcomm.simulation.data import FederatedTensors

CASES: list[tuple[str, dict[str, Any]]] = [
    ("dgc", {"density": 0.01, "warmup_rounds": 1}),
    ("stc", {}),
    ("signsgd", {}),
    ("signsgd", {"scale": True}),
    ("fedpaq", {}),
    ("lq", {"bits": 4}),
    ("lq", {"bits": 2, "rotation": "none"}),
]
IDS = [f"{n}-{'-'.join(map(str, o.values())) or 'default'}" for n, o in CASES]


@pytest.mark.parametrize("name", sorted(set(COMPRESSORS) - {"none"}))
def test_only_float_dense_entries_are_compressed(name: str) -> None:
    others = {
        "mask": Mask(torch.tensor([True, False, True])),
        "meta": Meta(torch.tensor([0.5])),
        "free": Free(torch.tensor([1.0, 0.0])),
        "sparse": Sparse(torch.tensor([2.0]), torch.tensor([1]), (3,)),
        "ints": Dense(torch.tensor([1, 2, 3])),
    }
    payload = Payload({"w": Dense(torch.linspace(-1, 1, 8)), **others})
    comp = build_compressor(name)
    out, _ = comp.encode(payload, comp.init(), torch.Generator().manual_seed(0), 1)
    assert list(out) == list(payload)
    assert all(out[k] is e for k, e in others.items())  # the very same objects
    assert not isinstance(out["w"], Dense)
    assert out["w"].decode().shape == (8,)


# --- config --------------------------------------------------------------------------------


def test_compressor_config_validates_and_builds() -> None:
    p = validate_params(tiny_params(**{"train.compressor": {"name": "dgc", "density": 0.01}}))
    cfg = p.train.compressor
    assert cfg.name == "dgc" and cfg.model_dump(exclude={"name"}) == {
        "density": 0.01,
        "warmup_rounds": 4,
        "index_bits": 64,
        "scope": "tensor",
        "vectors": "compress",
    }
    assert build_compressor(cfg.name, **cfg.model_dump(exclude={"name"})).name == "dgc"
    assert validate_params(tiny_params()).train.compressor.name == "none"


@pytest.mark.parametrize(
    ("compressor", "fragment"),
    [
        ({"name": "topk"}, "train.compressor.name: Input tag 'topk' found using 'name'"),
        (
            {"name": "dgc", "ratio": 0.1},
            "train.compressor.ratio: Extra inputs are not permitted (got 0.1; "
            "allowed keys: density, index_bits, name, scope, vectors, warmup_rounds)",
        ),
        ({"name": "stc", "density": 0}, "train.compressor.density: Input should be greater"),
        ({"name": "fedpaq", "levels": 0}, "train.compressor.levels"),
        ({"name": "signsgd", "levels": 3}, "train.compressor.levels: Extra inputs"),
    ],
)
def test_bad_compressor_configs_are_named(compressor: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate_params(tiny_params(**{"train.compressor": compressor}))
    assert fragment in str(info.value)


def test_config_union_matches_the_registry_and_its_defaults() -> None:
    members = get_args(get_args(CompressorConfig)[0])
    by_name = {m.model_fields["name"].default: m for m in members}
    assert set(by_name) == set(COMPRESSORS)
    for name, model in by_name.items():
        sig = inspect.signature(COMPRESSORS[name])
        defaults = {k: p.default for k, p in sig.parameters.items()}
        assert model().model_dump(exclude={"name"}) == defaults, name


# --- loop runs -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _model(fed: FederatedTensors) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=fed.input_shape, num_classes=fed.num_classes, hidden=[16])


def _run(
    name: str,
    options: dict[str, Any],
    fed: FederatedTensors,
    rounds: int = 2,
    ckpt: Path | None = None,
    resume: bool = False,
    server_lr: float = 1.0,
) -> loop.RunResult:
    cfg = loop.LoopConfig(
        rounds=rounds,
        clients_per_round=3,
        local=LocalConfig(epochs=1, batch_size=16, lr=0.05),
        seed=7,
        checkpoint_every=1,
    )
    alg = build_algorithm(CONFIGS["fedavg"](server={"optimizer": "sgd", "lr": server_lr}))
    comp = build_compressor(name, **options)
    return loop.run(
        cfg, alg, _model(fed), fed, comp, config_hash="c", checkpoint_path=ckpt, resume=resume
    )


def _rule(name: str, options: dict[str, Any], numels: list[int], round_: int) -> int:
    """The uplink bits of one client by the codec's rule (every fedavg entry is a float
    tensor of the update, and no update value is exactly zero where it is kept)."""
    if name == "dgc":
        d = warmup_density(options["density"], options["warmup_rounds"], round_)
        return sum(keep_count(d, n) * (32 + 64) for n in numels)
    if name == "stc":
        return sum(keep_count(1 / 400, n) * (1 + 64) + 32 for n in numels)
    if name == "signsgd":
        return sum(numels) + (32 * len(numels) if options.get("scale") else 0)
    if name == "lq":  # b bits per value + v_min, v_max (+ the rotation seed)
        meta = 64 if options.get("rotation") == "none" else 96
        return sum(options["bits"] * n + meta for n in numels)
    return sum(8 * n + 32 for n in numels)  # fedpaq, s = 127


def _numbers(res: loop.RunResult) -> list[dict[str, object]]:
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in res.state.round_rows]


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_loop_is_deterministic_and_ledger_follows_the_rule(
    name: str, options: dict[str, Any], fed: FederatedTensors
) -> None:
    a, b = _run(name, options, fed), _run(name, options, fed)
    assert a.ledger.rows == b.ledger.rows and _numbers(a) == _numbers(b)
    assert all(torch.equal(a.final_params[k], b.final_params[k]) for k in a.final_params)
    numels = [p.numel() for p in _model(fed).parameters()]
    up = [r for r in a.ledger.rows if r[2] == "up"]
    assert len(up) == 6
    for round_, _, _, payload_bits, index_bits, meta_bits, dense_bits, *_ in up:
        assert payload_bits + index_bits + meta_bits == _rule(name, options, numels, round_)
        assert dense_bits == 32 * sum(numels)


def test_signsgd_server_steps_by_the_vote(fed: FederatedTensors) -> None:
    init = {k: v.detach().clone() for k, v in _model(fed).named_parameters()}
    res = _run("signsgd", {}, fed, rounds=1, server_lr=0.01)
    for k, w in res.final_params.items():  # 3 clients never tie: every value moves by ±η_s
        torch.testing.assert_close((w - init[k]).abs(), torch.full_like(w, 0.01))


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_compressor_state_round_trips_through_checkpoint(
    name: str, options: dict[str, Any], fed: FederatedTensors, tmp_path: Path
) -> None:
    ckpt = tmp_path / "state.pt"
    full = _run(name, options, fed, rounds=3, ckpt=ckpt)  # saved after round 2
    saved = checkpoint.load(ckpt, "c")
    assert saved is not None and saved.round_ == 2
    states = [r.compressor_state for r in saved.clients.values()]
    if name in ("dgc", "stc"):
        assert all(isinstance(s, dict) and s for s in states)  # residuals were saved
        seen = [r["client_id"] for r in full.state.client_rows]
        assert len(seen) > len(set(seen))  # some client reuses its residual
    resumed = _run(name, options, fed, rounds=3, ckpt=ckpt, resume=True)
    assert resumed.resumed_from == 2
    assert _numbers(resumed) == _numbers(full)
    assert resumed.ledger.rows == full.ledger.rows
    assert all(
        torch.equal(resumed.final_params[k], full.final_params[k]) for k in full.final_params
    )
