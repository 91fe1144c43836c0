"""Policies that use the clock (issue 45): Oort's selection, ``fit_deadline`` compression, and
availability checked over a client's whole interval (windows and the diurnal model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from fedcomm.algorithms import fedavg
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.comm.compressors.config import DgcCompressor, NoCompressor
from fedcomm.errors import InputError
from fedcomm.models import build_model
from fedcomm.simulation import checkpoint, fitting, loop
from fedcomm.system.config import SystemConfig
from tests.conftest import digits_federation

DGC = DgcCompressor(density=0.1, warmup_rounds=0)


def _system(availability: dict[str, Any] | None = None, **policy: Any) -> SystemConfig:
    raw: dict[str, Any] = {
        "links": {
            "down": {"kind": "lognormal", "median": 2.0, "sigma": 1.0},
            "up": {"kind": "lognormal", "median": 0.05, "sigma": 1.0},
            "latency_s": {"kind": "constant", "value": 0.05},
        },
        "compute": {"reference_flops": 1e7, "speed": {"kind": "uniform", "low": 0.2, "high": 2}},
        "policy": policy,
    }
    if availability is not None:
        raw["availability"] = availability
    return SystemConfig.model_validate(raw)


def _run(
    system: SystemConfig, *, rounds: int = 4, k: int = 3, codec: Any = None, **extra: Any
) -> loop.RunResult:
    fed = digits_federation(8)
    cfg = loop.LoopConfig(
        rounds=rounds, clients_per_round=k, local=LocalConfig(epochs=1, batch_size=8), seed=0,
        system=system, codec=codec, checkpoint_every=2,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[8])
    comp = codec or NoCompressor()
    compressor = build_compressor(comp.name, **comp.model_dump(exclude={"name"}))
    return loop.run(cfg, fedavg.build(fedavg.Config()), model, fed, compressor, config_hash="h",
                    **extra)  # fmt: skip


# -- Oort ------------------------------------------------------------------------------------


def test_oort_samples_by_utility_and_learns_from_the_clients_it_aggregated() -> None:
    uniform = _run(_system(), rounds=6)
    res = _run(_system(selection={"kind": "oort"}), rounds=6)
    cohorts = [
        sorted(c["client_id"] for c in r.state.client_rows if c["round"] == n)
        for r in (uniform, res)
        for n in range(1, 7)
    ]
    assert cohorts[:6] != cohorts[6:]  # another draw than the uniform one
    arms = res.state.selection
    for c in res.state.client_rows:  # each aggregated client's report is what it reported
        last = max(x["round"] for x in res.state.client_rows if x["client_id"] == c["client_id"])
        if c["round"] == last and c["status"] == "aggregated":
            assert arms.last_round[c["client_id"]] == c["round"]
            assert arms.reward[c["client_id"]] == pytest.approx(c["num_examples"] * c["train_loss"])
            assert arms.duration[c["client_id"]] == c["sim_finish_s"]
    again = _run(_system(selection={"kind": "oort"}), rounds=6)
    assert again.ledger.rows == res.ledger.rows  # the seed decides every draw


def test_oort_resumes_with_what_it_knew(tmp_path: Path) -> None:
    cfg = _system(selection={"kind": "oort"})
    whole = _run(cfg, rounds=6)

    class Stop(Exception):
        pass

    class StopAt:
        run_id = None

        def log_round(self, round_: int, metrics: Any) -> None:
            if round_ == 5:
                raise Stop

    path = tmp_path / "ck.pt"
    with pytest.raises(Stop):
        _run(cfg, rounds=6, checkpoint_path=path, tracker=StopAt())
    kept = checkpoint.load(path, "h")
    assert kept is not None and kept.selection is not None
    resumed = _run(cfg, rounds=6, checkpoint_path=path)
    assert resumed.resumed_from == 4 and resumed.ledger.rows == whole.ledger.rows


# -- fit_deadline ----------------------------------------------------------------------------


def test_fit_deadline_sends_each_client_the_mildest_setting_that_arrives_in_time() -> None:
    ladder = [0.5, 0.05, 0.005]
    fixed = {d: _run(_system(deadline_s=1e9), codec=DGC.model_copy(update={"density": d}))
             for d in (0.5, 0.005)}  # fmt: skip
    roomy = _run(_system(deadline_s=1e9, compression={"kind": "fit_deadline", "ladder": ladder}),
                 codec=DGC)  # fmt: skip
    # everyone fits the mildest: the run is the fixed one at 0.5, bit for bit
    assert [r[:9] for r in roomy.ledger.rows] == [r[:9] for r in fixed[0.5].ledger.rows]
    assert {c["uplink_setting"] for c in roomy.state.client_rows} == {0.5}
    tight = _run(_system(deadline_s=1e-3, compression={"kind": "fit_deadline", "ladder": ladder}),
                 codec=DGC)  # fmt: skip
    # nobody fits: the strongest is sent (and they are stragglers), as the fixed run at 0.005
    assert [r[8] for r in tight.ledger.rows] == [r[8] for r in fixed[0.005].ledger.rows]
    assert {c["uplink_setting"] for c in tight.state.client_rows} == {0.005}
    # in between: mixed, and every aggregated client arrived by the deadline
    ups = sorted(c["sim_up_s"] + c["sim_finish_s"] - c["sim_up_s"]
                 for c in fixed[0.5].state.client_rows)  # fmt: skip
    mid = ups[len(ups) // 2]
    res = _run(_system(deadline_s=mid, compression={"kind": "fit_deadline", "ladder": ladder}),
               codec=DGC)  # fmt: skip
    settings = [c["uplink_setting"] for c in res.state.client_rows]
    assert len(set(settings)) > 1
    for c in res.state.client_rows:
        if c["status"] == "aggregated":
            assert c["sim_finish_s"] <= mid
    rows = res.state.round_rows
    assert all("system/uplink_setting" in r for r in rows)


def test_fit_tries_from_the_mildest_and_keeps_the_generator_of_the_one_sent() -> None:
    class FakeRound:
        def __init__(self) -> None:
            self.tried: list[float] = []

        def encode(self, turn: Any, comp: Any) -> Any:
            torch.rand(1, generator=turn.generator)  # each trial draws
            self.tried.append(comp.name)
            return 4 - len(self.tried)  # "the finish": 3, 2, 1 (the milder, the later)

    class FakeTurn:
        generator = torch.Generator().manual_seed(0)

    steps = fitting.ladder(DGC, [0.001, 0.1, 0.01])
    assert steps.values == (0.1, 0.01, 0.001)  # mildest first
    rnd, turn = FakeRound(), FakeTurn()
    before = turn.generator.get_state()
    trial = fitting.trials(rnd, turn, steps, retrain=None)  # type: ignore[arg-type]
    sent, enc, value = fitting.fit(steps, trial, lambda t, e: float(e), limit_s=2.0)  # type: ignore[arg-type]
    assert sent is turn and (enc, value) == (2, 0.01) and len(rnd.tried) == 2  # type: ignore[comparison-overlap]
    once = torch.Generator().set_state(before)
    torch.rand(1, generator=once)
    assert torch.equal(turn.generator.get_state(), once.get_state())  # one draw's worth


def test_fit_deadline_is_refused_without_a_codec_setting_or_deadline() -> None:
    with pytest.raises(InputError, match="codec 'none' has none"):
        fitting.ladder(NoCompressor(), [0.1])
    with pytest.raises(InputError, match=r"ladder: 2.0 is not a valid dgc density"):
        fitting.ladder(DGC, [0.1, 2.0])
    with pytest.raises(ValueError, match="compression fit_deadline fits each upload to deadline_s"):
        _system(compression={"kind": "fit_deadline", "ladder": [0.1]})


# -- availability over the interval -----------------------------------------------------------


def _leaving(tmp_path: Path, leave_s: float) -> dict[str, Any]:
    """Every client online from 0 on; client 0..7 go offline at ``leave_s``."""
    path = tmp_path / "w.csv"
    path.write_text("client_id,start_s,end_s\n" + "".join(
        f"{c},0,{leave_s}\n{c},{leave_s + 1000},1e12\n" for c in range(8)))  # fmt: skip
    return {"kind": "windows", "path": str(path)}


def test_a_client_that_leaves_before_it_finishes_is_dropped_under_interval(tmp_path: Path) -> None:
    free = _run(_system(), rounds=1)
    finishes = sorted(c["sim_finish_s"] for c in free.state.client_rows)
    leave = (finishes[0] + finishes[1]) / 2  # the first finishes, the others leave first
    start = _run(_system(_leaving(tmp_path, leave)), rounds=1)
    assert {c["status"] for c in start.state.client_rows} == {"aggregated"}  # checked at start
    res = _run(_system(_leaving(tmp_path, leave), check="interval"), rounds=1)
    status = {c["client_id"]: c["status"] for c in res.state.client_rows}
    assert sorted(status.values()) == ["aggregated", "departed", "departed"]
    row = res.state.round_rows[0]
    assert row["system/departed"] == 2.0 and row["system/finished"] == 1.0
    assert row["time/sim_round_s"] == pytest.approx(leave)  # the server saw them leave
    assert "system/departed" not in start.state.round_rows[0]


def test_partial_work_fits_the_steps_before_a_client_leaves(tmp_path: Path) -> None:
    free = _run(_system(), rounds=1)
    slow = max(free.state.client_rows, key=lambda c: c["sim_finish_s"])
    leave = slow["sim_finish_s"] - slow["sim_compute_s"] / 2  # half its work fits
    res = _run(_system(_leaving(tmp_path, leave), check="interval", deadline_s=1e6,
                       stragglers="partial"), rounds=1)  # fmt: skip
    row = next(c for c in res.state.client_rows if c["client_id"] == slow["client_id"])
    assert row["status"] == "partial_work" and row["sim_finish_s"] <= leave
    assert 0 < row["local_steps"] < slow["local_steps"]


def test_interval_needs_availability_that_changes_in_time() -> None:
    with pytest.raises(ValueError, match=r"policy\.check is 'interval' and availability is kind"):
        _system(check="interval")


def test_diurnal_availability_runs_and_clients_leave_when_their_window_ends() -> None:
    day = {"kind": "diurnal", "period_s": 20.0, "start": {"kind": "uniform", "low_h": 0,
           "high_h": 24}, "duty": {"kind": "constant", "value": 0.5}}  # fmt: skip
    res = _run(_system(day, check="interval", deadline_s=8.0), rounds=6)
    rows = res.state.round_rows
    assert all(r["system/online"] < 8 for r in rows)  # half the day each: some offline
    statuses = {c["status"] for c in res.state.client_rows}
    assert "aggregated" in statuses
    from fedcomm.system import population

    pop = population.draw(_system(day), 8, 0, None)
    for c in res.state.client_rows:  # each was online when its round started
        start = rows[c["round"] - 2]["time/sim_elapsed_s"] if c["round"] > 1 else 0.0
        assert pop.diurnal is not None and pop.diurnal.online_mask([c["client_id"]], start)[0]
        if c["status"] == "departed":
            assert pop.offline_at(c["client_id"], start) - start < c["sim_finish_s"]
