"""The round under a ``system`` section (issue 30): who is aggregated is decided by each client's
encoded bits and work; the clock and the drops are deterministic; without ``system`` nothing
changes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedcomm.algorithms import fedavg
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.models import build_model
from fedcomm.simulation import loop
from fedcomm.system.config import SystemConfig
from tests.conftest import digits_federation


def _system(**policy: Any) -> SystemConfig:
    return SystemConfig.model_validate(
        {
            "links": {
                "down": {"kind": "lognormal", "median": 2.0, "sigma": 1.0},
                "up": {"kind": "lognormal", "median": 0.5, "sigma": 1.0},
                "latency_s": {"kind": "constant", "value": 0.05},
            },
            "compute": {
                "reference_flops": 1e7,
                "speed": {"kind": "uniform", "low": 0.2, "high": 2},
            },
            "policy": policy,
        }
    )


def _run(
    system: SystemConfig | None,
    compressor: str = "none",
    backend: str = "sequential",
    k: int = 3,
    rounds: int = 3,
    sharded: Any = None,
    **options: object,
) -> loop.RunResult:
    fed = digits_federation(8)
    cfg = loop.LoopConfig(
        rounds=rounds, clients_per_round=k, local=LocalConfig(epochs=1, batch_size=8),
        seed=0, eval_every=1, backend=backend, system=system,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[8])
    algo = fedavg.build(fedavg.Config())
    compressor_ = build_compressor(compressor, **options)
    return loop.run(cfg, algo, model, fed, compressor_, config_hash="h", sharded=sharded)


def test_without_a_deadline_every_client_is_aggregated_and_timed() -> None:
    res = _run(_system())
    rows = res.state.round_rows
    assert [r["system/sampled"] for r in rows] == [3.0, 3.0, 3.0]
    assert [r["system/dropped"] for r in rows] == [0.0, 0.0, 0.0]
    clients = [c for c in res.state.client_rows if c["round"] == 1]
    # the round lasts until its slowest client; each client's time adds up from its parts
    assert rows[0]["time/sim_round_s"] == pytest.approx(max(c["sim_finish_s"] for c in clients))
    for c in clients:
        parts = c["sim_down_s"] + c["sim_compute_s"] + c["sim_up_s"] + 2 * 0.05
        assert c["sim_finish_s"] == pytest.approx(parts)
        assert c["status"] == "aggregated"
    elapsed = [r["time/sim_elapsed_s"] for r in rows]
    assert elapsed == pytest.approx([sum(r["time/sim_round_s"] for r in rows[: i + 1])
                                     for i in range(3)])  # fmt: skip


def test_the_upload_time_is_the_encoded_bits_over_the_uplink() -> None:
    dense = _run(_system())
    signs = _run(_system(), "signsgd")  # 1 bit an entry instead of 32
    for d, s in zip(dense.state.client_rows[:3], signs.state.client_rows[:3], strict=True):
        assert d["client_id"] == s["client_id"]
        assert d["sim_down_s"] == pytest.approx(s["sim_down_s"])  # same downlink
        assert 20 < d["sim_up_s"] / s["sim_up_s"] <= 32  # payload bits, plus per-tensor meta


def test_a_deadline_drops_the_clients_that_miss_it_and_the_ledger_says_so() -> None:
    free = _run(_system())
    finishes = sorted(c["sim_finish_s"] for c in free.state.client_rows if c["round"] == 1)
    deadline = (finishes[0] + finishes[1]) / 2  # between the first and second to finish
    res = _run(_system(deadline_s=deadline))
    first = res.state.round_rows[0]
    assert first["system/finished"] == 1.0 and first["system/dropped"] == 2.0
    assert first["time/sim_round_s"] == deadline
    ups = [r for r in res.ledger.rows if r[0] == 1 and r[2] == "up"]
    assert sorted(r[7] for r in ups) == ["not_sent", "not_sent", "sent"]
    for r in ups:  # bits on the link: none for a dropped client; its encoding is kept
        assert (r[3] + r[4] + r[5] == 0) == (r[7] == "not_sent") and r[8] > 0
    downs = [r for r in res.ledger.rows if r[0] == 1 and r[2] == "down"]
    assert len(downs) == 3 and all(r[7] == "sent" for r in downs)  # everyone's downlink charged
    assert first["comm/up_bytes"] == sum(r[3] + r[4] + r[5] for r in ups) / 8
    # a cut uplink may instead be charged for what it had sent when the round closed
    cut = _run(_system(deadline_s=deadline, cut_uplink="partial"))
    cut_ups = [r for r in cut.ledger.rows if r[0] == 1 and r[2] == "up"]
    assert [r[8] for r in cut_ups] == [r[8] for r in ups]
    assert sum(r[3] for r in cut_ups if r[7] != "sent") >= 0


def test_over_selection_aggregates_the_first_k_to_finish() -> None:
    res = _run(_system(over_selection=1.0), k=2)  # sample 4, keep the first 2
    for rnd in (1, 2, 3):
        clients = [c for c in res.state.client_rows if c["round"] == rnd]
        assert len(clients) == 4
        kept = sorted(c["sim_finish_s"] for c in clients if c["status"] == "aggregated")
        dropped = [c["sim_finish_s"] for c in clients if c["status"] == "dropped"]
        assert len(kept) == 2 and min(dropped) >= max(kept)
        row = res.state.round_rows[rnd - 1]
        assert row["time/sim_round_s"] == pytest.approx(kept[-1])  # closes at the K-th finish


def test_partial_work_trains_the_steps_that_fit() -> None:
    free = _run(_system(), rounds=1)
    clients = free.state.client_rows
    slow = max(clients, key=lambda c: c["sim_finish_s"])
    deadline = slow["sim_finish_s"] - slow["sim_compute_s"] / 2  # half its work fits
    res = _run(_system(deadline_s=deadline, stragglers="partial"), rounds=1)
    row = next(c for c in res.state.client_rows if c["client_id"] == slow["client_id"])
    assert row["status"] == "partial_work"
    assert 0 < row["local_steps"] < slow["local_steps"]
    assert row["sim_finish_s"] <= deadline
    assert res.state.round_rows[0]["system/partial"] == 1.0


def test_the_same_seed_gives_the_same_clock_on_both_backends() -> None:
    a = _run(_system(deadline_s=2.0), backend="sequential")
    b = _run(_system(deadline_s=2.0), backend="sequential")
    v = _run(_system(deadline_s=2.0), backend="vectorized")
    keys = ("time/sim_round_s", "time/sim_elapsed_s", "system/finished", "system/dropped")
    for x, y, z in zip(a.state.round_rows, b.state.round_rows, v.state.round_rows, strict=True):
        for key in keys:
            assert x[key] == y[key]
            assert x[key] == pytest.approx(z[key], rel=1e-9)
    assert a.ledger.rows == b.ledger.rows == v.ledger.rows


def test_without_system_the_round_is_as_before() -> None:
    res = _run(None)
    assert not any(k.startswith(("system/", "time/sim")) for k in res.state.round_rows[0])
    assert all(r[7] == "sent" and r[8] == r[3] + r[4] + r[5] for r in res.ledger.rows)
    assert all("status" not in c for c in res.state.client_rows)


def test_partial_work_needs_a_deadline() -> None:
    with pytest.raises(ValueError, match="stragglers must be 'drop' without a deadline"):
        _system(stragglers="partial")


def test_masked_training_is_charged_its_density_dense_training_whole() -> None:
    from fedcomm.algorithms import feddst

    fed = digits_federation(8)
    cfg = loop.LoopConfig(
        rounds=1, clients_per_round=3, local=LocalConfig(epochs=1, batch_size=8), seed=0,
        system=_system(),
    )  # fmt: skip

    def compute(algo: object) -> dict[int, float]:
        torch.manual_seed(0)
        model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[8])
        res = loop.run(cfg, algo, model, fed, build_compressor("none"), config_hash="h")  # type: ignore[arg-type]
        return {c["client_id"]: c["sim_compute_s"] for c in res.state.client_rows}

    dense = compute(fedavg.build(fedavg.Config()))
    sparse = compute(feddst.build(feddst.Config(sparsity=0.8)))
    assert dense.keys() == sparse.keys()
    for cid, seconds in dense.items():  # the weights 80% sparse (every layer at sparsity 0.8)
        assert sparse[cid] / seconds == pytest.approx(0.2, abs=0.03)


def test_only_online_clients_are_sampled() -> None:
    cfg = _system()
    cfg = cfg.model_copy(update={"availability": SystemConfig.model_validate(
        {"availability": {"kind": "constant", "p": 0.5}}).availability})  # fmt: skip
    res = _run(cfg, rounds=3)
    from fedcomm.system import population

    pop = population.draw(cfg, 8, 0, None)
    counts = []
    for row in res.state.round_rows:
        online = pop.online(0, row["round"], 0.0)  # (a probability: the time does not matter)
        counts.append(len(online))
        assert row["system/online"] == len(online)
        sampled = {c["client_id"] for c in res.state.client_rows if c["round"] == row["round"]}
        assert sampled <= set(online) and len(sampled) == min(3, len(online))
    assert min(counts) < 8  # some clients were offline


def test_a_round_with_nobody_online_leaves_the_model_and_lasts_the_wait(tmp_path: Path) -> None:
    windows = tmp_path / "w.csv"
    windows.write_text("client_id,start_s,end_s\n0,1000000,2000000\n")  # nobody online at first
    cfg = _system(deadline_s=7.0)
    cfg = cfg.model_copy(update={"availability": SystemConfig.model_validate(
        {"availability": {"kind": "windows", "path": str(windows)}}).availability})  # fmt: skip
    res = _run(cfg, rounds=2)
    first, second = res.state.round_rows
    assert first["system/sampled"] == 0 and first["time/sim_round_s"] == 7.0
    assert second["time/sim_elapsed_s"] == 14.0
    assert not res.state.client_rows and not res.ledger.rows
    torch.manual_seed(0)
    fed = digits_federation(8)
    init = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[8])
    for name, p in init.named_parameters():  # the model never moved
        assert torch.equal(res.final_params[name], p.detach())


def test_up_ratio_counts_a_cut_uplink_for_what_it_sent() -> None:
    """issue 45: under ``cut_uplink: partial`` the ratio's numerator counted the aggregated
    clients' dense models only while its denominator held the cut uplinks' bits too, so dense
    FedAvg reported 0.80-0.90. A message stands for the dense model in proportion to the part of
    its encoding it sent: dense FedAvg's ratio is 1, in the round metrics and in the ledger's
    traffic table alike."""
    from fedcomm.comm import bits
    from fedcomm.comm.ledger import Ledger
    from fedcomm.evaluation.traffic import upload_ratios

    free = _run(_system())
    finishes = sorted(c["sim_finish_s"] for c in free.state.client_rows if c["round"] == 1)
    cut = _run(_system(deadline_s=(finishes[0] + finishes[1]) / 2, cut_uplink="partial"))
    statuses = {r[7] for r in cut.ledger.rows if r[2] == "up"}
    assert "partial" in statuses  # the case: some uplink was cut mid-way
    assert [r["comm/up_ratio"] for r in cut.state.round_rows] == pytest.approx([1.0] * 3)
    numel = sum(v.numel() for v in cut.final_params.values())
    table = upload_ratios(Ledger(cut.ledger.rows).frame(), bits.dense(numel))
    assert table["up_ratio"].to_list() == pytest.approx([1.0] * 3)


def test_cost_vs_dense_sums_each_rounds_own_cohort() -> None:
    """issue 45: ``comm/cost_vs_dense`` divided every past round's bits by the current round's
    cohort; with availability the cohort changes from round to round. The baseline is dense
    FedAvg's model down and up for each client sampled in each round so far."""
    from fedcomm.comm import bits

    cfg = _system(over_selection=1.0)
    cfg = cfg.model_copy(update={"availability": SystemConfig.model_validate(
        {"availability": {"kind": "constant", "p": 0.4}}).availability})  # fmt: skip
    res = _run(cfg, rounds=4, k=2)
    sampled = [r["system/sampled"] for r in res.state.round_rows]
    assert len(set(sampled)) > 1  # the case: cohorts of different sizes
    dense = bits.dense(sum(v.numel() for v in res.final_params.values()))
    for i, row in enumerate(res.state.round_rows):
        baseline = sum(2 * dense * s for s in sampled[: i + 1])
        if not baseline:  # nobody sampled yet: no baseline to compare with
            assert row["comm/cost_vs_dense"] is None
            continue
        assert row["comm/cost_vs_dense"] == pytest.approx(row["comm/cum_bytes"] * 8 / baseline)
