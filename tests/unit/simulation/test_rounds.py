"""One round as an object (``simulation/rounds.py``): what each of ``Round``'s steps records.

The loop and the timed branch only ask a :class:`Round` for its steps, so the steps are tested
here on their own: a real FedAvg round on a small digits federation, sequential backend."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.algorithms.core import RoundContext
from fedcomm.comm.codecs import Compressor, build_compressor, encode_dense
from fedcomm.comm.ledger import Ledger
from fedcomm.comm.payload import Payload
from fedcomm.models.progressive import dense_numel
from fedcomm.seeding import Stream, torch_generator
from fedcomm.simulation.backends import Backend
from fedcomm.simulation.data import FederatedTensors
from fedcomm.simulation.divergence import DivergenceError
from fedcomm.simulation.rounds import Round, RunParts
from fedcomm.simulation.start import initial_state
from tests.conftest import digits_federation, small_loop

COHORT = [0, 2, 4]


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _round(
    fed: FederatedTensors,
    *,
    local_due: bool = True,
    compressor: Compressor | None = None,
    on_divergence: str = "skip",
) -> Round:
    model, cfg = small_loop(fed)
    alg = build_algorithm(CONFIGS["fedavg"]())
    comp = compressor or build_compressor("none")
    state = initial_state(alg, model, fed, cfg.seed, cfg.local, "rounds")
    backend = Backend("sequential", alg, model, fed, cfg.local, 1)
    parts = RunParts(
        alg, model, fed, comp, backend, cfg.local, cfg.seed, 256, on_divergence, 1e6,
        dense_numel(model),
    )  # fmt: skip
    ctx = RoundContext(1, torch_generator(cfg.seed, Stream.SERVER, 1), cfg.seed, model)
    return Round(parts, 1, state, Ledger(list(state.ledger_rows)), ctx, local_due)


def _play(rnd: Round, clients: list[int]) -> None:
    for turn in rnd.turns(clients):
        rnd.send_down(turn)
        enc = rnd.encode(turn)
        rnd.send_up(turn.client_id, enc.payload)
        rnd.take(turn, enc, {})


def test_taken_clients_are_aggregated_in_cohort_order_and_charged(fed: FederatedTensors) -> None:
    rnd = _round(fed)
    _play(rnd, COHORT)
    assert [u.client_id for u in rnd.uplinks] == COHORT
    assert len(rnd.payloads) == len(rnd.losses) == len(rnd.train_s) == 3 and not rnd.skipped
    # the ledger: down then up per client, as the messages passed; the round's totals are its
    rows = rnd.ledger.rows
    assert [(r[1], r[2], r[7]) for r in rows] == [
        (c, d, "sent") for c in COHORT for d in ("down", "up")
    ]
    assert rnd.up_bits == rnd.ledger.up_bits() > 0
    assert rnd.down_bits == rnd.ledger.down_bits() > 0
    assert rnd.up_dense_bits == 3 * 32 * rnd.run.numel
    # evaluated now (local accuracy due): each client's row and record hold the result
    assert [r["client_id"] for r in rnd.state.client_rows] == COHORT
    for row in rnd.state.client_rows:
        assert 0.0 <= row["local_accuracy"] <= 1.0 and row["test_n"] > 0
    assert sorted(rnd.state.clients) == COHORT
    assert all(rnd.state.clients[c].pending is None for c in COHORT)


def test_when_local_evaluation_is_not_due_the_upload_waits(fed: FederatedTensors) -> None:
    rnd = _round(fed, local_due=False)
    _play(rnd, COHORT)
    assert all(r["local_accuracy"] is None for r in rnd.state.client_rows)
    assert all(rnd.state.clients[c].pending is not None for c in COHORT)
    assert [rnd.state.clients[c].pending_row for c in COHORT] == [0, 1, 2]


def test_a_cut_uplink_is_charged_what_it_sent_and_the_server_never_sees_it(
    fed: FederatedTensors,
) -> None:
    rnd = _round(fed)
    turns = list(rnd.turns(COHORT))
    for t in turns:
        rnd.send_down(t)
    encoded = [rnd.encode(t) for t in turns]
    rnd.send_up(0, encoded[0].payload)
    rnd.take(turns[0], encoded[0], {"status": "aggregated"})
    full = encoded[1].payload.nbits().total
    rnd.cut(turns[1], encoded[1].payload, 0, {"status": "dropped"})
    rnd.cut(turns[2], encoded[2].payload, full // 3, {"status": "dropped"})
    ups = [(r[1], r[7]) for r in rnd.ledger.rows if r[2] == "up"]
    assert ups == [(0, "sent"), (2, "not_sent"), (4, "partial")]
    assert rnd.up_bits == rnd.ledger.up_bits() == encoded[0].payload.nbits().total + full // 3
    assert [u.client_id for u in rnd.uplinks] == [0]
    assert [(r["client_id"], r["status"]) for r in rnd.state.client_rows] == [
        (0, "aggregated"), (2, "dropped"), (4, "dropped"),
    ]  # fmt: skip
    assert sorted(rnd.state.clients) == [0]  # a dropped client's state stays as it was


def _poison(nth: int) -> Compressor:
    """An uplink 'compressor' that turns the ``nth`` update it encodes (1-based) into NaNs."""
    calls = [0]

    def encode(payload: Payload, state: Any, gen: Any, round_: int) -> tuple[Payload, Any]:
        calls[0] += 1
        if calls[0] != nth:
            return payload, state
        nan = {k: torch.full_like(v, math.nan) for k, v in payload.decode().items()}
        return encode_dense(nan), state

    return Compressor("poison", lambda: None, encode)


def test_a_diverged_client_is_charged_and_left_out_or_stops_the_run(
    fed: FederatedTensors,
) -> None:
    rnd = _round(fed, compressor=_poison(2))  # the second client of the cohort: client 2
    _play(rnd, COHORT)
    assert rnd.skipped == [2]
    assert [u.client_id for u in rnd.uplinks] == [0, 4]
    assert [r[1] for r in rnd.ledger.rows if r[2] == "up"] == COHORT  # sent and charged
    assert [r["client_id"] for r in rnd.state.client_rows] == COHORT
    stop = _round(fed, compressor=_poison(1), on_divergence="stop")
    with pytest.raises(DivergenceError, match="client 0 diverged"):
        _play(stop, COHORT)
