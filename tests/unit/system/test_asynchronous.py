"""Asynchronous aggregation on the simulated clock (issue 45): FedBuff and FedAsync take each
client's update when the clock says it arrives, weighed by how many server steps it is stale;
with no spread in time and the buffer the round's cohort, FedBuff is the synchronous run."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcomm.algorithms import fedavg
from fedcomm.algorithms.core import Uplink
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.errors import InputError
from fedcomm.models import build_model
from fedcomm.simulation import asynchronous, checkpoint, loop
from fedcomm.system.config import PolicyConfig, SystemConfig
from tests.conftest import digits_federation

STEPS = LocalConfig(steps=2, batch_size=8)  # the same work for every client (each has >= 16)


def _system(links: str = "spread", **policy: Any) -> SystemConfig:
    if links == "spread":  # clients of different speeds and links
        down = {"kind": "lognormal", "median": 2.0, "sigma": 1.0}
        up = {"kind": "lognormal", "median": 0.5, "sigma": 1.0}
        speed: dict[str, Any] = {"kind": "uniform", "low": 0.2, "high": 2}
    else:  # every client alike: with the same work and bits, they finish at the same instant
        down = {"kind": "constant", "value": 2.0}
        up = {"kind": "constant", "value": 0.5}
        speed = {"kind": "constant", "value": 1.0}
    return SystemConfig.model_validate(
        {
            "links": {"down": down, "up": up, "latency_s": {"kind": "constant", "value": 0.05}},
            "compute": {"reference_flops": 1e7, "speed": speed},
            "policy": policy,
        }
    )


def _run(
    system: SystemConfig | None,
    *,
    k: int = 3,
    rounds: int = 4,
    algo: Any = None,
    local: LocalConfig = STEPS,
    backend: str = "sequential",
    compressor: str = "none",
    checkpoint_every: int = 2,
    **extra: Any,
) -> loop.RunResult:
    fed = digits_federation(8)
    cfg = loop.LoopConfig(
        rounds=rounds, clients_per_round=k, local=local, seed=0, eval_every=1, backend=backend,
        system=system, checkpoint_every=checkpoint_every,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[8])
    algorithm = algo if algo is not None else fedavg.build(fedavg.Config())
    return loop.run(
        cfg, algorithm, model, fed, build_compressor(compressor), config_hash="h", **extra
    )


def test_fedbuff_with_no_spread_and_k_the_cohort_is_the_synchronous_run() -> None:
    sync = _run(_system("alike"))
    buff = _run(_system("alike", aggregation="fedbuff"))
    # the case: every client of a round finished at the same instant
    for rnd in (1, 2, 3, 4):
        finishes = {c["sim_finish_s"] for c in sync.state.client_rows if c["round"] == rnd}
        assert len(finishes) == 1
    for name, value in sync.final_params.items():
        assert torch.equal(buff.final_params[name], value)
    keys = ("global/accuracy", "comm/up_bytes", "comm/down_bytes", "time/sim_elapsed_s")
    for s, b in zip(sync.state.round_rows, buff.state.round_rows, strict=True):
        for key in keys:
            assert s[key] == b[key], key
        assert b["system/staleness_max"] == 0.0
    assert [r[:9] for r in sync.ledger.rows] == [r[:9] for r in buff.ledger.rows]
    assert [c["client_id"] for c in sync.state.client_rows] == [
        c["client_id"] for c in buff.state.client_rows
    ]


def test_fedasync_one_client_at_a_time_fresh_and_alpha_one_is_the_synchronous_run() -> None:
    sync = _run(_system("alike"), k=1)
    fedasync = _run(
        _system("alike", aggregation="fedasync", mixing=1.0, staleness={"kind": "constant"}), k=1
    )
    for name, value in sync.final_params.items():  # (w + Δ) - w is Δ up to rounding
        torch.testing.assert_close(fedasync.final_params[name], value, rtol=0, atol=1e-6)


def test_staleness_is_what_the_clock_says() -> None:
    res = _run(_system(aggregation="fedbuff", concurrency=5, buffer_size=2), k=3, rounds=6)
    ends = [0.0] + [r["time/sim_elapsed_s"] for r in res.state.round_rows]
    assert all(b >= a for a, b in itertools.pairwise(ends))
    taus = []
    for c in res.state.client_rows:
        start, arrival = c["sim_start_s"], c["sim_start_s"] + c["sim_finish_s"]
        r = c["round"]
        assert c["status"] == "aggregated"
        # its version: the server steps closed by its start; its round: the step it arrived in
        assert c["version"] == sum(end <= start for end in ends[1:])
        assert ends[r - 1] <= arrival <= ends[r]
        assert c["staleness"] == (r - 1) - c["version"]
        taus.append(c["staleness"])
    assert max(taus) > 0  # the case: some update arrived stale
    for row in res.state.round_rows:  # a step closes at its K-th arrival
        mine = [c for c in res.state.client_rows if c["round"] == row["round"]]
        assert len(mine) == 2
        assert row["time/sim_elapsed_s"] == pytest.approx(
            max(c["sim_start_s"] + c["sim_finish_s"] for c in mine), abs=1e-12
        )
        assert row["system/staleness_max"] == max(c["staleness"] for c in mine)
        assert row["system/in_flight"] <= 5
    # the ledger's uplinks carry the version their client trained on, its downlinks the model's
    version = {(c["round"], c["client_id"]): c["version"] for c in res.state.client_rows}
    for row in res.ledger.rows:
        r, cid, direction = row[0], row[1], row[2]
        if direction == "up":
            assert row[9] == version[(r, cid)]
        else:
            assert row[9] == r - 1


def test_stale_updates_are_weighed_by_the_staleness_function() -> None:
    const = _run(_system(aggregation="fedbuff", concurrency=5, buffer_size=2,
                         staleness={"kind": "constant"}), rounds=6)  # fmt: skip
    poly = _run(_system(aggregation="fedbuff", concurrency=5, buffer_size=2), rounds=6)
    # the same clock (the weights change the model, not who trains when: the bits are dense)
    assert [c["staleness"] for c in const.state.client_rows] == [
        c["staleness"] for c in poly.state.client_rows
    ]
    assert any(not torch.equal(const.final_params[k], v) for k, v in poly.final_params.items())


def test_the_weights_and_fedasync_rebase() -> None:
    poly = PolicyConfig.model_validate({"aggregation": "fedbuff"}).staleness
    hinge = PolicyConfig.model_validate(
        {"aggregation": "fedbuff", "staleness": {"kind": "hinge", "a": 10, "b": 4}}
    ).staleness
    assert [asynchronous.weight(poly, t) for t in (0, 3, 8)] == [1.0, 0.5, 1 / 3]
    assert [asynchronous.weight(hinge, t) for t in (0, 4, 5, 6)] == [1.0, 1.0, 1 / 11, 1 / 21]
    policy = PolicyConfig.model_validate({"aggregation": "fedasync", "mixing": 0.5})
    w_v, w_now = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, 3.0])}
    delta = {"w": torch.tensor([0.5, -1.0])}  # the client's model: w_v + Δ = [1.5, 1.0]
    flight = asynchronous.Flight(versions={0: w_v})
    played = asynchronous.Played([_arrived(7, 0)], [], 1, 8, 1.0, {7: 3})  # τ = 3: s = 1/2
    (u,) = asynchronous.weigh(policy, played, flight, w_now)([Uplink(7, 10, delta)])
    new = w_now["w"] + u.tensors["w"]  # a plain server step: w + Δ'
    a = 0.5 * 0.5
    torch.testing.assert_close(new, (1 - a) * w_now["w"] + a * torch.tensor([1.5, 1.0]))


def _arrived(cid: int, version: int) -> Any:
    class _F:
        client_id = cid

    f = _F()
    f.version = version  # type: ignore[attr-defined]
    return f


def test_a_client_past_its_time_limit_is_dropped_and_its_uplink_cut() -> None:
    free = _run(_system(aggregation="fedbuff", concurrency=4, buffer_size=2), rounds=3)
    took = sorted(c["sim_finish_s"] for c in free.state.client_rows)
    limit = took[len(took) // 2]
    res = _run(_system(aggregation="fedbuff", concurrency=4, buffer_size=2, deadline_s=limit),
               rounds=3)  # fmt: skip
    rows = res.state.client_rows
    dropped = [c for c in rows if c["status"] == "dropped"]
    assert dropped and all(c["sim_finish_s"] > limit for c in dropped)
    assert all(c["sim_finish_s"] <= limit for c in rows if c["status"] == "aggregated")
    cut = [r for r in res.ledger.rows if r[2] == "up" and r[7] == "not_sent"]
    assert len(cut) == len(dropped)
    assert sum(r["system/dropped"] for r in res.state.round_rows) == len(dropped)


def test_an_algorithm_that_needs_synchronous_rounds_is_refused_by_name() -> None:
    from fedcomm.algorithms import feddst, fedl1

    for algo in (feddst.build(feddst.Config(sparsity=0.8)), fedl1.build(fedl1.Config())):
        with pytest.raises(InputError, match=f"algorithm '{algo.name}' cannot run asynchronously"):
            _run(_system(aggregation="fedbuff"), algo=algo, rounds=1)
    with pytest.raises(InputError, match=r"policy.buffer_size=9 exceeds the run's 8 clients"):
        _run(_system(aggregation="fedbuff", buffer_size=9), rounds=1)


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ({"concurrency": 4}, "concurrency: read only under aggregation fedbuff or fedasync"),
        ({"aggregation": "fedbuff", "over_selection": 0.5}, "over_selection must be 0"),
        ({"aggregation": "fedasync", "buffer_size": 2}, "buffer_size must be 1"),
        ({"aggregation": "fedbuff", "mixing": 0.5}, "mixing: read only under aggregation fedasync"),
        ({"aggregation": "fedbuff", "staleness": {"kind": "hinge", "a": 1}}, "b"),
        ({"aggregation": "fedbuff", "concurrency": 0}, "greater than or equal to 1"),
    ],
)
def test_bad_policies_name_the_key(policy: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PolicyConfig.model_validate(policy)


def test_same_seed_same_clock_on_both_backends() -> None:
    cfg = _system(aggregation="fedbuff", concurrency=5, buffer_size=2)
    local = LocalConfig(epochs=1, batch_size=8)
    a = _run(cfg, local=local)
    b = _run(cfg, local=local)
    v = _run(cfg, local=local, backend="vectorized")
    assert a.ledger.rows == b.ledger.rows == v.ledger.rows
    for x, y, z in zip(a.state.round_rows, b.state.round_rows, v.state.round_rows, strict=True):
        assert x["time/sim_elapsed_s"] == y["time/sim_elapsed_s"]
        assert x["time/sim_elapsed_s"] == pytest.approx(z["time/sim_elapsed_s"], rel=1e-9)
    for name, value in a.final_params.items():
        assert torch.equal(b.final_params[name], value)


class _Stop(Exception):
    pass


class _StopAfter:
    """A tracker that stops the run once ``round_`` is logged (a crash after a checkpoint)."""

    run_id = None

    def __init__(self, round_: int) -> None:
        self.round_ = round_

    def log_round(self, round_: int, metrics: Any) -> None:
        if round_ == self.round_:
            raise _Stop


def test_a_resumed_run_keeps_its_clients_in_flight(tmp_path: Path) -> None:
    cfg = _system(aggregation="fedasync", concurrency=4)
    whole = _run(cfg, rounds=6)
    path = tmp_path / "ck.pt"
    with pytest.raises(_Stop):
        _run(cfg, rounds=6, checkpoint_path=path, tracker=_StopAfter(5))
    kept = checkpoint.load(path, "h")
    assert kept is not None and kept.round_ == 4 and kept.flight.clients  # clients in flight
    resumed = _run(cfg, rounds=6, checkpoint_path=path)
    assert resumed.resumed_from == 4
    assert resumed.ledger.rows == whole.ledger.rows

    def simulated(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:  # (train_s: wall time)
        return [{k: v for k, v in r.items() if k != "train_s"} for r in rows]

    assert simulated(resumed.state.client_rows) == simulated(whole.state.client_rows)
    for name, value in whole.final_params.items():
        assert torch.equal(resumed.final_params[name], value)
