"""Golden runs: every registered algorithm's bits, metrics and final model, pinned.

Each algorithm runs three seeded rounds on the digits federation (the backend tests' setup and
overrides, so the runs reach each algorithm's special cases) and is compared with the values
recorded in ``golden/<name>.json``:

- the ledger, row by row, exactly: bits are counted from the payloads;
- the per-round metrics and the final parameters within float tolerance, since another CPU may
  sum in another order;
- with ``FEDCOMM_GOLDEN_EXACT=1``, also the SHA-256 of the final parameters and of the metrics,
  on both backends: a refactor that claims "behaviour unchanged" is checked to the bit on the
  machine that recorded the goldens.

The goldens were recorded before the sub-model family and the big algorithms were refactored
(issue 18). ``FEDCOMM_GOLDEN_RECORD=1`` writes them anew; only do that for a change that is meant
to change an algorithm's numbers, and say so in the commit.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors
from tests.conftest import digits_federation
from tests.contract.test_backends import ALL, BATCHED, _run

GOLDEN = Path(__file__).parent / "golden"
RECORD = os.environ.get("FEDCOMM_GOLDEN_RECORD") == "1"
EXACT = os.environ.get("FEDCOMM_GOLDEN_EXACT") == "1"


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _metrics(res: loop.RunResult) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in row.items() if not k.startswith("time/")} for row in res.state.round_rows
    ]


def _params_digest(res: loop.RunResult) -> str:
    h = hashlib.sha256()
    for k in sorted(res.final_params):
        t = res.final_params[k].detach().cpu().contiguous()
        h.update(k.encode())
        h.update(str(t.dtype).encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def _metrics_digest(res: loop.RunResult) -> str:
    return hashlib.sha256(repr(_metrics(res)).encode()).hexdigest()


def _record(name: str, seq: loop.RunResult, vec: loop.RunResult) -> dict[str, Any]:
    return {
        "algorithm": name,
        "ledger": [list(r[:7]) for r in seq.ledger.rows],
        "metrics": _metrics(seq),
        "params": {
            k: {"shape": list(t.shape), "values": t.detach().cpu().flatten().tolist()}
            for k, t in sorted(seq.final_params.items())
        },
        "sha256": {
            "sequential": {"params": _params_digest(seq), "metrics": _metrics_digest(seq)},
            "vectorized": {"params": _params_digest(vec), "metrics": _metrics_digest(vec)},
        },
    }


def _assert_metrics_close(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert sorted(a) == sorted(b)
        for key, va in a.items():
            vb = b[key]
            if isinstance(va, float) and isinstance(vb, float):
                if math.isnan(vb):
                    assert math.isnan(va), (a["round"], key)
                else:
                    assert va == pytest.approx(vb, rel=1e-4, abs=1e-5), (a["round"], key)
            else:
                assert va == vb, (a["round"], key)


def _assert_matches(res: loop.RunResult, want: dict[str, Any], backend: str) -> None:
    # the goldens predate the ledger's status and encoded_bits columns (issue 30): without a
    # system section every message is sent, its encoded bits the bits it counts
    assert [list(r[:7]) for r in res.ledger.rows] == want["ledger"]
    assert all(r[7] == "sent" and r[8] == r[3] + r[4] + r[5] for r in res.ledger.rows)
    _assert_metrics_close(json.loads(json.dumps(_metrics(res))), want["metrics"])
    assert sorted(res.final_params) == sorted(want["params"])
    for k, p in want["params"].items():
        expect = torch.tensor(p["values"], dtype=res.final_params[k].dtype).reshape(p["shape"])
        torch.testing.assert_close(res.final_params[k].cpu(), expect, rtol=1e-4, atol=1e-5)
    if EXACT:
        assert _params_digest(res) == want["sha256"][backend]["params"], "params not bit-equal"
        assert _metrics_digest(res) == want["sha256"][backend]["metrics"], "metrics not equal"


@pytest.mark.parametrize("name", ALL)
def test_golden_run(name: str, fed: FederatedTensors) -> None:
    seq = _run(name, fed, "sequential")
    vec = _run(name, fed, "vectorized")
    path = GOLDEN / f"{name}.json"
    if RECORD:
        path.write_text(json.dumps(_record(name, seq, vec), indent=1) + "\n")
    assert path.exists(), f"no golden for {name}: record one with FEDCOMM_GOLDEN_RECORD=1"
    want = json.loads(path.read_text())
    _assert_matches(seq, want, "sequential")
    _assert_matches(vec, want, "vectorized")
    assert vec.backend == ("vectorized" if name in BATCHED else "sequential")


def test_every_registered_algorithm_has_a_golden() -> None:
    on_disk = {p.stem for p in GOLDEN.glob("*.json")}
    assert on_disk == set(ALL), "goldens and the registry disagree"
