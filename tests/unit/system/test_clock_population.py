"""The clock's arithmetic (links that vary second by second, the round's close) and the
population's draws (deterministic, the distributions asked for, real traces, a user's table)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedcomm.errors import InputError
from fedcomm.system import population
from fedcomm.system.clock import (
    Capacity,
    ClientTime,
    batch_sizes,
    client_time,
    decide,
    steps_that_fit,
)
from fedcomm.system.config import SystemConfig


def test_a_constant_link_moves_bits_at_its_rate() -> None:
    link = Capacity(np.array([8.0]))  # 8 Mbit/s
    assert link.seconds(8e6, at_s=123.0) == pytest.approx(1.0)
    assert link.bits_between(2.0, 2.5) == pytest.approx(4e6)


def test_a_trace_link_integrates_second_by_second_and_wraps() -> None:
    link = Capacity(np.array([1.0, 0.0, 3.0]), start_s=0.5)  # an outage in second 1
    # from 0.5: 0.5 s at 1 Mbit/s = 0.5 Mbit, then 1 s of outage, then 3 Mbit/s
    assert link.seconds(0.5e6, at_s=0.0) == pytest.approx(0.5)
    assert link.seconds(2.0e6, at_s=0.0) == pytest.approx(0.5 + 1.0 + 0.5)
    # a full cycle moves 4 Mbit: 4 + 0.5 Mbit from 0.5 takes one cycle (3 s) plus 0.5 s
    assert link.seconds(4.5e6, at_s=0.0) == pytest.approx(3.5)
    # the time the client starts matters: starting at 1.0 (trace 1.5: inside the outage)
    assert link.seconds(3e6, at_s=1.0) == pytest.approx(0.5 + 1.0)
    assert link.bits_between(0.0, 2.0) == pytest.approx(0.5e6 + 0 + 1.5e6)
    with pytest.raises(ValueError, match="capacity > 0"):
        Capacity(np.array([0.0, 0.0]))


def test_client_time_adds_latency_down_compute_up() -> None:
    down, up = Capacity(np.array([10.0])), Capacity(np.array([1.0]))
    t = client_time(3, down, up, 0.1, 1e9, round_start_s=0.0, down_bits=10_000_000,
                    work_flops=2e9, up_bits=500_000)  # fmt: skip
    assert (t.down_s, t.compute_s, t.up_s) == pytest.approx((1.0, 2.0, 0.5))
    assert t.finish_s == pytest.approx(0.1 + 1.0 + 2.0 + 0.1 + 0.5)


def _t(cid: int, finish: float) -> ClientTime:
    return ClientTime(cid, 0.0, 0.0, finish, 0.0)


def test_decide_keeps_the_first_k_within_the_deadline() -> None:
    times = [_t(0, 5.0), _t(1, 1.0), _t(2, 3.0), _t(3, 3.0)]
    d = decide(times, 2, None)
    assert d.accepted == {1, 2} and d.round_s == 3.0  # ties by client id
    d = decide(times, 4, 4.0)  # one misses the deadline: the round lasts to the deadline
    assert d.accepted == {1, 2, 3} and d.round_s == 4.0
    d = decide(times, 4, None)
    assert d.accepted == {0, 1, 2, 3} and d.round_s == 5.0
    assert decide([], 3, None).round_s == 0.0


def test_batch_sizes_follow_the_local_schedule() -> None:
    assert batch_sizes(10, 4, 2, None) == [4, 4, 2, 4, 4, 2]
    assert batch_sizes(10, 4, None, 4) == [4, 4, 2, 4]
    assert steps_that_fit([4, 4, 2], 0.5, 4.0) == 2  # 2 s, 4 s, 5 s
    assert steps_that_fit([4, 4, 2], 0.5, 1.9) == 0


def _cfg(**raw: Any) -> SystemConfig:
    return SystemConfig.model_validate(raw)


def test_draws_are_seeded_and_follow_their_distributions() -> None:
    cfg = _cfg(
        links={"down": {"kind": "lognormal", "median": 4.0, "sigma": 0.5},
               "up": {"kind": "uniform", "low": 1.0, "high": 2.0}},
        compute={"reference_flops": 2e9, "speed": {"kind": "constant", "value": 0.5}},
        availability={"kind": "constant", "p": 0.3},
    )  # fmt: skip
    a, b, c = (population.draw(cfg, 4000, s, None) for s in (0, 0, 1))
    down = np.array([x.mean_mbps for x in a.down])
    assert down.tolist() == [x.mean_mbps for x in b.down]
    assert down.tolist() != [x.mean_mbps for x in c.down]
    assert np.median(down) == pytest.approx(4.0, rel=0.05)
    assert np.std(np.log(down)) == pytest.approx(0.5, rel=0.05)
    up = np.array([x.mean_mbps for x in a.up])
    assert up.min() >= 1.0 and up.max() <= 2.0
    assert (a.flops_per_s == 1e9).all()
    online = [len(a.online(0, r, 0.0)) / 4000 for r in range(1, 6)]
    assert all(0.27 < f < 0.33 for f in online) and len(set(online)) > 1  # redrawn each round
    assert a.online(0, 3, 0.0) == b.online(0, 3, 0.0)
    assert population.cohort(0, 1, list(range(10)), 3) == population.cohort(
        0, 1, list(range(10)), 3
    )
    assert population.cohort(0, 1, [4, 7], 3) == [4, 7]  # fewer online than asked: all of them


def test_real_traces_and_benchmarks_feed_the_draw(data_root: Path) -> None:
    cfg = _cfg(
        links={"down": {"kind": "flash"}, "up": {"kind": "trace", "source": "mahimahi"}},
        compute={"speed": {"kind": "ai_benchmark"}},
    )
    p = population.draw(cfg, 200, 0, data_root)
    assert all(len(x.mbps) > 100 for x in p.up)  # whole Mahimahi uplink traces, per second
    assert len({x.start_s for x in p.up}) > 100  # each client its own start second
    assert 0.5 < np.median([x.mean_mbps for x in p.up]) < 2.0  # README: 1.04 Mbit/s median
    assert 15 < np.median([x.mean_mbps for x in p.down]) < 60  # FLASH users' downlinks
    assert np.median(p.flops_per_s / 1e10) == pytest.approx(1.0, rel=0.3)
    windowed = _cfg(links={"up": {"kind": "trace", "source": "mahimahi", "window_s": 30}})
    w = population.draw(windowed, 50, 0, data_root)
    assert all(len(x.mbps) == 30 and x.mbps.max() > 0 for x in w.up)
    with pytest.raises(InputError, match="data root"):
        population.draw(cfg, 10, 0, None)


def test_a_user_table_by_id_or_drawn(tmp_path: Path) -> None:
    table = tmp_path / "clients.csv"
    table.write_text(
        "client_id,down_mbps,up_mbps,compute_speed,availability\n"
        "0,10,1,1.0,1.0\n1,20,2,0.5,0.5\n2,30,3,2.0,0.0\n"
    )
    cfg = _cfg(links={"down": {"kind": "table"}, "up": {"kind": "table"}},
               compute={"speed": {"kind": "table"}}, availability={"kind": "table"},
               table=str(table))  # fmt: skip
    p = population.draw(cfg, 3, 0, None)
    assert [x.mean_mbps for x in p.down] == [10, 20, 30]
    assert p.flops_per_s.tolist() == [1e10, 5e9, 2e10]
    assert 2 not in p.online(0, 1, 0.0) and 0 in p.online(0, 1, 0.0)
    with pytest.raises(InputError, match=r"no row for client\(s\) \[3, 4\]"):
        population.draw(cfg, 5, 0, None)
    drawn = population.draw(cfg.model_copy(update={"assign": "draw"}), 5, 0, None)
    assert {x.mean_mbps for x in drawn.down} <= {10.0, 20.0, 30.0}


def test_the_table_must_be_given_when_read() -> None:
    with pytest.raises(ValueError, match=r"table must be set: links\.down"):
        _cfg(links={"down": {"kind": "table"}})
