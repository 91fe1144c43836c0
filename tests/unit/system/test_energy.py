"""The clients' energy under ``system.energy``: each client-round charged from the bits its
messages encoded and the FLOPs its local steps computed, summed per round and over the run;
without the section nothing of it exists and every number is what it was."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedcomm.algorithms import fedavg
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.comm.ledger import SCHEMA
from fedcomm.errors import InputError
from fedcomm.models import build_model
from fedcomm.simulation import loop
from fedcomm.system import energy, population, radios, traces
from fedcomm.system.clock import ClientTime
from fedcomm.system.config import SystemConfig
from tests.conftest import digits_federation

LATENCY = 0.05
# the MLP's training FLOPs per example: 3 x forward (64 -> 8 -> 10: 2*64*8 + 2*8*10)
EXAMPLE_FLOPS = 3 * (2 * 64 * 8 + 2 * 8 * 10)
J_PER_FLOP = 2e-9
# a made-up radio with round numbers, so each client's joules are a short sum
RADIO = {"down_j_per_bit": 1e-8, "up_j_per_bit": 4e-8, "active_w": 1.5,
         "tail": [{"seconds": 0.5, "watts": 2.0}]}  # fmt: skip


def _system(energy_: dict[str, Any] | None, **policy: Any) -> SystemConfig:
    """Constant links (2 Mbit/s down, 0.5 up) and compute (1e5 FLOP/s: local work of seconds,
    longer than RADIO's tail), the same for every client."""
    raw: dict[str, Any] = {
        "links": {
            "down": {"kind": "constant", "value": 2.0},
            "up": {"kind": "constant", "value": 0.5},
            "latency_s": {"kind": "constant", "value": LATENCY},
        },
        "compute": {"reference_flops": 1e5, "speed": {"kind": "constant", "value": 1.0}},
        "policy": policy,
    }
    if energy_ is not None:
        raw["energy"] = energy_
    return SystemConfig.model_validate(raw)


def _energy(**over: Any) -> dict[str, Any]:
    return {
        "links": {"down": "wifi", "up": "wifi"},
        "radios": {"wifi": RADIO},
        "compute": {"kind": "constant", "j_per_flop": J_PER_FLOP},
        **over,
    }


def _run(system: SystemConfig | None, rounds: int = 2, k: int = 3) -> loop.RunResult:
    fed = digits_federation(8)
    cfg = loop.LoopConfig(
        rounds=rounds, clients_per_round=k, local=LocalConfig(epochs=1, batch_size=8),
        seed=0, eval_every=1, system=system,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[8])
    algo = fedavg.build(fedavg.Config())
    return loop.run(cfg, algo, model, fed, build_compressor("none"), config_hash="h")


def _bits(res: loop.RunResult, round_: int, cid: int, direction: str) -> tuple[int, int]:
    """A message's bits on the link and as encoded, from the ledger."""
    for row in res.ledger.rows:
        r: dict[str, Any] = dict(zip(SCHEMA, row, strict=False))
        if (r["round"], r["client_id"], r["direction"]) == (round_, cid, direction):
            return r["payload_bits"] + r["index_bits"] + r["meta_bits"], r["encoded_bits"]
    raise AssertionError((round_, cid, direction))


def test_a_constant_link_run_logs_the_hand_computed_joules() -> None:
    res = _run(_system(_energy()))
    before = 0.0
    for rnd, row in enumerate(res.state.round_rows, start=1):
        clients = [c for c in res.state.client_rows if c["round"] == rnd]
        assert len(clients) == 3 and all(c["status"] == "aggregated" for c in clients)
        for c in clients:
            down_bits, _ = _bits(res, rnd, c["client_id"], "down")
            _, up_bits = _bits(res, rnd, c["client_id"], "up")
            assert c["sim_compute_s"] > 0.5  # the downlink's tail runs whole before the upload
            # J/bit x bits + active W x seconds + the tail (0.5 s at 2 W), each direction
            down = 1e-8 * down_bits + 1.5 * (down_bits / 2e6) + 1.0
            up = 4e-8 * up_bits + 1.5 * (up_bits / 0.5e6) + 1.0
            work = c["num_examples"] * EXAMPLE_FLOPS  # one epoch of every local example
            assert c["energy_down_j"] == down
            assert c["energy_up_j"] == up
            assert c["energy_compute_j"] == work * J_PER_FLOP
            assert c["energy_j"] == down + work * J_PER_FLOP + up
        assert row["energy/round_j"] == sum((c["energy_j"] for c in clients), 0.0)
        assert row["energy/down_j"] == sum((c["energy_down_j"] for c in clients), 0.0)
        assert row["energy/compute_j"] == sum((c["energy_compute_j"] for c in clients), 0.0)
        assert row["energy/up_j"] == sum((c["energy_up_j"] for c in clients), 0.0)
        assert row["energy/dropped_j"] == 0.0
        assert row["energy/cum_j"] == before + row["energy/round_j"]
        before = row["energy/cum_j"]


def test_without_the_section_nothing_is_charged_and_nothing_changes() -> None:
    plain = _run(_system(None))
    charged = _run(_system(_energy()))
    for a, b in zip(plain.state.round_rows, charged.state.round_rows, strict=True):
        assert not [k for k in a if k.startswith("energy")]
        assert {k for k in b if k.startswith("energy/")} == {
            "energy/round_j", "energy/down_j", "energy/compute_j", "energy/up_j",
            "energy/dropped_j", "energy/cum_j",
        }  # fmt: skip
        timing = {k: v for k, v in b.items() if not k.startswith(("energy/", "time/"))}
        assert {k: v for k, v in a.items() if not k.startswith("time/")} == timing
        assert a["time/sim_elapsed_s"] == b["time/sim_elapsed_s"]
    columns = ("energy_down_j", "energy_compute_j", "energy_up_j", "energy_j")
    for a, b in zip(plain.state.client_rows, charged.state.client_rows, strict=True):
        assert not set(columns) & set(a)
        assert {k: v for k, v in b.items() if k not in columns and k != "train_s"} == {
            k: v for k, v in a.items() if k != "train_s"
        }
    assert plain.ledger.rows == charged.ledger.rows
    for name, tensor in plain.final_params.items():
        assert torch.equal(tensor, charged.final_params[name])


def test_the_downlink_tail_is_cut_where_the_upload_starts() -> None:
    long_tail = {**RADIO, "tail": [{"seconds": 1e4, "watts": 2.0}]}
    res = _run(_system(_energy(radios={"wifi": long_tail})), rounds=1)
    for c in res.state.client_rows:
        down_bits, _ = _bits(res, 1, c["client_id"], "down")
        _, up_bits = _bits(res, 1, c["client_id"], "up")
        gap = c["sim_compute_s"] + LATENCY  # from the download's end to the upload's start
        assert c["energy_down_j"] == 1e-8 * down_bits + 1.5 * (down_bits / 2e6) + 2.0 * gap
        assert c["energy_up_j"] == 4e-8 * up_bits + 1.5 * (up_bits / 0.5e6) + 2.0 * 1e4
    # on two radios (Wi-Fi down, LTE up) the download's tail runs whole
    two = _energy(links={"down": "wifi", "up": "lte"}, radios={"wifi": long_tail})
    other = _run(_system(two), rounds=1)
    row = other.state.client_rows[0]
    down_bits, _ = _bits(other, 1, row["client_id"], "down")
    assert row["energy_down_j"] == 1e-8 * down_bits + 1.5 * (down_bits / 2e6) + 2.0 * 1e4


@pytest.mark.parametrize("cut_uplink", ["not_sent", "partial"])
def test_a_dropped_client_is_charged_what_it_did_until_the_round_closed(cut_uplink: str) -> None:
    free = _run(_system(_energy()), rounds=1)
    finish = sorted(c["sim_finish_s"] for c in free.state.client_rows)
    deadline = (finish[0] + finish[1]) / 2  # one client makes it
    res = _run(_system(_energy(), deadline_s=deadline, cut_uplink=cut_uplink), rounds=1)
    row = res.state.round_rows[0]
    clients = res.state.client_rows
    dropped = [c for c in clients if c["status"] == "dropped"]
    assert len(dropped) == 2
    computing = 0
    for c in dropped:
        down_bits, _ = _bits(res, 1, c["client_id"], "down")
        start = LATENCY + c["sim_down_s"]  # its local work's start
        if deadline >= start + c["sim_compute_s"]:
            continue  # (it was uploading at the close: charged its share, checked below)
        computing += 1
        share = (deadline - start) / c["sim_compute_s"]  # of its work, done by the close
        work = c["num_examples"] * EXAMPLE_FLOPS
        assert c["energy_compute_j"] == pytest.approx(share * work * J_PER_FLOP, rel=1e-12)
        assert c["energy_up_j"] == 0.0  # its upload never started
        # its whole download and the download's whole tail (no upload followed it)
        assert c["energy_down_j"] == 1e-8 * down_bits + 1.5 * (down_bits / 2e6) + 1.0
    assert computing  # (some client was still computing when the round closed)
    for c in dropped:  # never more than the whole round would have cost
        same = next(f for f in free.state.client_rows if f["client_id"] == c["client_id"])
        assert c["energy_j"] <= same["energy_j"]
    assert row["energy/dropped_j"] == sum((c["energy_j"] for c in dropped), 0.0)
    assert row["energy/round_j"] == sum((c["energy_j"] for c in clients), 0.0)
    assert 0 < row["energy/dropped_j"] < row["energy/round_j"]


def test_training_power_gives_each_phone_its_own_joules_per_flop() -> None:
    system = SystemConfig.model_validate(
        {
            "compute": {
                "reference_flops": 1e5,
                "speed": {"kind": "uniform", "low": 0.2, "high": 2},
            },
            "energy": {**_energy(), "compute": {"kind": "power", "watts": 3.0}},
        }
    )
    res = _run(system, rounds=1)
    for c in res.state.client_rows:  # W x the seconds it computed
        assert c["energy_compute_j"] == pytest.approx(3.0 * c["sim_compute_s"], rel=1e-12)


def test_the_sourced_radios_are_aros_numbers() -> None:
    lte = radios.SOURCED["lte"]
    assert lte.up_j_per_bit == pytest.approx(438.39e-9)  # mW per Mbit/s = nJ/bit
    assert lte.down_j_per_bit == pytest.approx(51.97e-9)
    assert lte.active_w == 1.2
    drx = (0.002 * 1.68 + 0.038 * 1.06) / 0.04  # long DRX: a 2 ms ping at 1.68 W every 40 ms
    assert lte.tail_j(math.inf) == pytest.approx(0.1 * 1.2 + 0.02 * 1.122 + 10 * drx)
    assert lte.tail_j(0.05) == pytest.approx(0.05 * 1.2)  # cut inside its first state
    assert radios.SOURCED["umts"].tail_j(math.inf) == pytest.approx(4 * 1.30 + 10 * 0.30)
    assert radios.SOURCED["wifi"].tail_j(math.inf) == pytest.approx(0.25 * 0.403)
    assert "evdo" not in radios.SOURCED and "5g" not in radios.SOURCED  # nothing sourced


def test_a_client_stopped_mid_phase_is_charged_its_share() -> None:
    model = energy.EnergyModel(
        down=(radios.Radio(1e-6, 1e-6, 1.0),), up=(radios.Radio(1e-6, 2e-6, 1.0),),
        down_tech=("lte",), up_tech=("lte",), j_per_flop=np.array([1e-3]), tails=False,
    )  # fmt: skip
    time = ClientTime(0, latency_s=1.0, down_s=2.0, compute_s=4.0, up_s=8.0)  # up from 8 s
    whole = energy.client_energy(model, time, down_bits=1e6, work_flops=1e3, up_bits=1e6)
    assert (whole.down_j, whole.compute_j, whole.up_j) == (3.0, 1.0, 10.0)
    mid_up = energy.client_energy(
        model, time, down_bits=1e6, work_flops=1e3, up_bits=1e6, stop_s=12.0
    )
    assert (mid_up.down_j, mid_up.compute_j, mid_up.up_j) == (3.0, 1.0, 5.0)  # half the upload
    mid_work = energy.client_energy(
        model, time, down_bits=1e6, work_flops=1e3, up_bits=1e6, stop_s=4.0
    )
    assert (mid_work.down_j, mid_work.compute_j, mid_work.up_j) == (3.0, 0.25, 0.0)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"compute": {"kind": "constant", "j_per_flop": 1e-9}},  # links default to auto
         r"energy.links.down is 'auto'.*links.down is kind 'constant'.*lte, umts, evdo, wifi, 5g"),
        ({"links": {"down": "lte", "up": "evdo"}, "compute": {"kind": "power", "watts": 2}},
         r"energy.radios.evdo must be set: links.up is evdo.*no sourced evdo.*lte, umts, wifi"),
        ({"links": {"down": "lte", "up": "lte"}},
         r"compute must be set.*no sourced J/FLOP"),
        ({"links": {"down": "lte", "up": "lte"}, "compute": {"kind": "constant", "j_per_flop": -1}},
         r"energy.compute.constant.j_per_flop\n.*greater than or equal to 0"),
        ({"links": {"down": "lte", "up": "lte"}, "compute": {"kind": "power", "watts": 0}},
         r"energy.compute.power.watts\n.*greater than 0"),
        ({"links": {"down": "gsm", "up": "lte"}, "compute": {"kind": "power", "watts": 2}},
         r"energy.links.down\n.*'auto', 'lte', 'umts', 'evdo', 'wifi' or '5g'.*'gsm'"),
        ({"links": {"down": "lte", "up": "lte"}, "radios": {"lte": {"down_j_per_bit": 1e-9}},
          "compute": {"kind": "power", "watts": 2}},
         r"energy.radios.lte.up_j_per_bit\n.*Field required"),
        ({"links": {"down": "lte", "up": "lte"}, "compute": {"kind": "power", "watts": 2},
          "radios": {"lte": {**RADIO, "tail": [{"seconds": -1, "watts": 1}]}}},
         r"energy.radios.lte.tail.0.seconds\n.*greater than 0"),
    ],
)  # fmt: skip
def test_bad_energy_settings_name_the_key_the_value_and_what_is_allowed(
    raw: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        SystemConfig.model_validate({"energy": raw})


def test_an_asynchronous_server_charges_each_arrival_and_each_dropped_client() -> None:
    free = _run(_system(None, aggregation="fedbuff", concurrency=4, buffer_size=2), rounds=3)
    took = sorted(c["sim_finish_s"] for c in free.state.client_rows)
    limit = took[len(took) // 2]  # some clients past it are dropped
    res = _run(
        _system(_energy(), aggregation="fedbuff", concurrency=4, buffer_size=2, deadline_s=limit),
        rounds=3,
    )
    rows = res.state.client_rows
    assert {c["status"] for c in rows} == {"aggregated", "dropped"}
    for c in rows:
        rnd = c["round"]
        down_bits, _ = _bits(res, c["version"] + 1, c["client_id"], "down")  # its start's round
        _, up_bits = _bits(res, rnd, c["client_id"], "up")
        work = c["num_examples"] * EXAMPLE_FLOPS
        if c["status"] == "aggregated":  # whole, as a synchronous client
            assert c["energy_j"] == (
                1e-8 * down_bits + 1.5 * (down_bits / 2e6) + 1.0 + work * J_PER_FLOP
                + 4e-8 * up_bits + 1.5 * (up_bits / 0.5e6) + 1.0
            )  # fmt: skip
        else:  # stopped at its limit: less than the whole
            assert 0 < c["energy_j"] < (
                1e-8 * down_bits + 1.5 * (down_bits / 2e6) + 1.0 + work * J_PER_FLOP
                + 4e-8 * up_bits + 1.5 * (up_bits / 0.5e6) + 1.0
            )  # fmt: skip
    before = 0.0
    for row in res.state.round_rows:
        mine = [c for c in rows if c["round"] == row["round"]]
        assert row["energy/round_j"] == sum((c["energy_j"] for c in mine), 0.0)
        dropped = [c["energy_j"] for c in mine if c["status"] == "dropped"]
        assert row["energy/dropped_j"] == sum(dropped, 0.0)
        assert row["energy/cum_j"] == before + row["energy/round_j"]
        before = row["energy/cum_j"]


def test_fivegophers_links_need_5g_numbers() -> None:
    raw = {"links": {"down": {"kind": "trace", "source": "fivegophers"}}}
    with pytest.raises(ValidationError, match=r"energy.links.up is 'auto'"):
        SystemConfig.model_validate({**raw, "energy": _energy(links={}, radios={"5g": RADIO})})
    with pytest.raises(ValidationError, match=r"energy.radios.5g must be set: links.down is 5g"):
        SystemConfig.model_validate({**raw, "energy": _energy(links={"up": "lte"})})
    given = _energy(links={"up": "lte"}, radios={"5g": RADIO})
    assert SystemConfig.model_validate({**raw, "energy": given}).energy is not None


@pytest.mark.parametrize("window_s", [None, 30])
def test_mahimahi_clients_are_charged_their_own_traces_technology(
    data_root: Path, window_s: int | None
) -> None:
    link = {"kind": "trace", "source": "mahimahi", "window_s": window_s}
    raw: dict[str, Any] = {"links": {"up": link}}
    up_only = _energy(links={"down": "lte", "up": "auto"}, radios={})
    cfg = SystemConfig.model_validate({**raw, "energy": up_only})
    clients = population.draw(cfg, 40, 0, data_root)
    with pytest.raises(InputError, match=r"energy.radios.evdo must be set.*Verizon-EVDO"):
        energy.build(cfg, clients, 0, data_root)
    cfg = SystemConfig.model_validate({**raw, "energy": {**up_only, "radios": {"evdo": RADIO}}})
    model = energy.build(cfg, clients, 0, data_root)
    found = traces.link_traces(data_root, "mahimahi", "up")
    named = traces.mahimahi_technologies(data_root, "up")
    assert set(model.up_tech) == {"lte", "umts", "evdo"}  # 40 clients draw every kind
    evdo = radios.Radio(1e-8, 4e-8, 1.5, ((0.5, 2.0),))  # RADIO, as given
    for cid, tech in enumerate(model.up_tech):  # the trace each client drew, found by content
        mbps = clients.up[cid].mbps
        if window_s is None:
            mine = [t for t in found if np.array_equal(t.mbps, mbps)]
        else:
            mine = [t for t in found if np.isin(mbps, t.mbps).all()]
        assert tech in {named[t.name] for t in mine}
        assert model.up[cid] == (evdo if tech == "evdo" else radios.SOURCED[tech])
    assert all(r == radios.SOURCED["lte"] for r in model.down)
