"""Compressors create every tensor on the device of the tensors they work with.

The run below is repeated with ``torch.set_default_device("meta")`` while all real data stays on
the CPU: a construction without an explicit ``device=`` (``torch.zeros``, ``torch.rand(...,
generator=g)``, ...) then lands on ``meta`` and fails when it meets a CPU tensor or is read as a
number. Both runs must charge the same bits and decode to the same tensors, on the CPU, so the
draws from the CPU generators and the ledger do not depend on the device either.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch import Tensor

from fedcomm.comm.codecs import COMPRESSORS, build_compressor
from fedcomm.comm.ledger import Ledger
from fedcomm.comm.payload import Dense, Free, Mask, Meta, Payload, Sparse
from fedcomm.seeding import Stream, torch_generator

ROUNDS = (1, 2)  # two rounds: the residuals (error feedback) of round 1 are read in round 2
CLIENTS = (0, 1)  # a cohort of two: SignSGD's majority vote sees more than one uplink
SEED = 3

CASES: list[tuple[str, dict[str, Any]]] = [(name, {}) for name in sorted(COMPRESSORS)] + [
    ("dgc", {"density": 0.3, "warmup_rounds": 0}),
    ("dgc", {"density": 0.3, "warmup_rounds": 0, "scope": "model"}),
    ("dgc", {"density": 0.3, "warmup_rounds": 0, "vectors": "dense"}),
    ("stc", {"density": 0.3}),
    ("signsgd", {"scale": True}),
    ("fedpaq", {"levels": 3}),
    ("lq", {"bits": 2, "rotation": "padded"}),
    ("lq", {"bits": 3, "rotation": "none"}),
    ("sp", {"keep": 0.5}),
    ("sp", {"keep": 0.5, "bits": 8}),
    ("sp", {"keep": 0.5, "bits": 4, "rotation": "padded"}),
    ("sp", {"keep": 0.5, "bits": 2, "rotation": "none"}),
]
IDS = [f"{n}-{'-'.join(map(str, o.values())) or 'default'}" for n, o in CASES]


def _payload(round_: int, client: int) -> Payload:
    """A small uplink, all on the CPU: float updates with zeros (one all zero), a masked
    dropout-style entry with its ``keep/`` mask, and entries that pass through."""
    g = torch.Generator(device="cpu").manual_seed(100 * round_ + client)
    w = torch.randn(4, 5, generator=g, device="cpu")
    w[0, :2] = 0.0
    b = torch.randn(6, generator=g, device="cpu")
    b[3] = 0.0
    keep = torch.tensor([[1, 0, 1, 1], [0, 1, 1, 0]], dtype=torch.bool, device="cpu")
    masked = torch.randn(keep.shape, generator=g, device="cpu")[keep]
    masked[1] = 0.0
    return Payload(
        {
            "w": Dense(w),
            "b": Dense(b),
            "zeros": Dense(torch.zeros(3, device="cpu")),
            "empty": Dense(torch.zeros(0, 3, device="cpu")),
            "w/x": Dense(masked),
            "keep/x": Free(keep),
            "mask": Mask(torch.tensor([True, False, True], device="cpu")),
            "meta": Meta(torch.tensor([0.5], device="cpu")),
            "ints": Dense(torch.tensor([1, 2, 3], device="cpu")),
            "sparse": Sparse(
                torch.tensor([2.0], device="cpu"), torch.tensor([1], device="cpu"), (3,)
            ),
        }
    )


@dataclass
class Run:
    rows: list[tuple[int, int, str, int, int, int, int]]  # the ledger's rows
    decoded: list[dict[str, Tensor]]  # per round and client: payload.decode()
    aggregated: list[dict[str, Tensor]]  # per round and client: what the server aggregates
    states: list[dict[str, Tensor]]  # per round and client: the compressor state's tensors


def _tensors(state: object) -> dict[str, Tensor]:
    if isinstance(state, dict):
        return {k: v for k, v in state.items() if isinstance(v, Tensor)}
    return {}


def _run(name: str, options: dict[str, Any], payloads: dict[tuple[int, int], Payload]) -> Run:
    comp = build_compressor(name, **options)
    ledger = Ledger()
    states = {c: comp.init() for c in CLIENTS}
    run = Run([], [], [], [])
    for round_ in ROUNDS:
        uplinks = []
        for client in CLIENTS:
            generator = torch_generator(SEED, Stream.CLIENT, round_, client)
            out, states[client] = comp.encode(
                payloads[round_, client], states[client], generator, round_
            )
            ledger.record(round_, client, "up", out)
            run.decoded.append(out.decode())
            run.states.append(_tensors(states[client]))
            uplinks.append(out)
        hook = comp.server_hook
        run.aggregated += hook(uplinks) if hook is not None else [p.decode() for p in uplinks]
    run.rows = list(ledger.rows)
    return run


@contextmanager
def meta_default_device() -> Iterator[None]:
    """Tensors made without ``device=`` land on ``meta`` (and fail next to CPU tensors)."""
    torch.set_default_device("meta")
    try:
        yield
    finally:
        torch.set_default_device(None)


def _assert_same_on_cpu(got: list[dict[str, Tensor]], want: list[dict[str, Tensor]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert list(g) == list(w)
        for key in w:
            assert g[key].device.type == "cpu", key
            assert g[key].dtype == w[key].dtype and torch.equal(g[key], w[key]), key


@pytest.mark.parametrize(("name", "options"), CASES, ids=IDS)
def test_compressor_creates_no_tensor_off_its_inputs_device(
    name: str, options: dict[str, Any]
) -> None:
    payloads = {(r, c): _payload(r, c) for r in ROUNDS for c in CLIENTS}
    want = _run(name, options, payloads)
    with meta_default_device():
        got = _run(name, options, payloads)
    assert got.rows == want.rows  # the same bits charged, message by message
    assert any(r[3] + r[4] + r[5] > 0 for r in want.rows)
    _assert_same_on_cpu(got.decoded, want.decoded)
    _assert_same_on_cpu(got.aggregated, want.aggregated)
    _assert_same_on_cpu(got.states, want.states)
