"""Real traces load with their README's counts and units; user tables are checked cell by cell."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from fedcomm.errors import InputError
from fedcomm.system.traces import (
    ClientTable,
    Trace,
    Windows,
    compute_scores,
    flash_users,
    link_traces,
    read_client_table,
    read_windows,
)

# --- the real traces (numbers: the folders' README.md) -----------------------------------------


def pooled_median(traces: list[Trace]) -> float:
    return float(np.median(np.concatenate([t.mbps for t in traces])))


def test_mahimahi_has_7_downlinks_and_6_uplinks_in_mbit_per_second(data_root: Path) -> None:
    down = link_traces(data_root, "mahimahi", "down")
    up = link_traces(data_root, "mahimahi", "up")
    assert (len(down), len(up)) == (7, 6)
    assert all(t.name.endswith(".down") for t in down) and all(t.name.endswith(".up") for t in up)
    # README: pooled 1-s medians 2.21 (down) and 1.04 (up) Mbit/s, over bins that include each
    # trace's partial last second, which link_traces leaves out (so 2.22 here)
    assert pooled_median(down) == pytest.approx(2.21, abs=0.015)
    assert pooled_median(up) == pytest.approx(1.04, abs=0.01)
    # whole seconds only: floor(duration_s) bins (README table: 786 s, 1012 s; 139.987 s -> 139)
    seconds = {t.name: len(t.mbps) for t in down + up}
    assert seconds["mahimahi/ATT-LTE-driving.down"] == 786
    assert seconds["mahimahi/ATT-LTE-driving.up"] == 1012
    assert seconds["mahimahi/TMobile-LTE-short.down"] == 139
    assert sum(len(t.mbps) for t in down) == 3649 and sum(len(t.mbps) for t in up) == 3407
    # outages (0-capacity seconds) are kept: 9.3% of ATT-LTE-driving.up's seconds
    att_up = next(t for t in up if t.name == "mahimahi/ATT-LTE-driving.up")
    assert float(np.mean(att_up.mbps == 0)) == pytest.approx(0.093, abs=0.002)


def test_fivegophers_has_120_downlink_runs(data_root: Path) -> None:
    runs = link_traces(data_root, "fivegophers", "down")
    assert len(runs) == 120
    assert pooled_median(runs) == pytest.approx(277.6, abs=0.05)  # README: 277.6 Mbit/s
    assert sum(len(t.mbps) for t in runs) == 7257  # every row of throughput.csv, none invented
    assert runs[0].name == "fivegophers/SPRINT-1conn-US-East-run001"
    with pytest.raises(InputError, match="evidently downlink"):
        link_traces(data_root, "fivegophers", "up")


@pytest.mark.parametrize(("source", "direction"), [("mahimahi", "up"), ("fivegophers", "down")])
def test_traces_are_sorted_and_the_same_on_every_read(
    data_root: Path, source: str, direction: str
) -> None:
    first = link_traces(data_root, source, direction)  # type: ignore[arg-type]
    again = link_traces(data_root, source, direction)  # type: ignore[arg-type]
    names = [t.name for t in first]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert names == [t.name for t in again]
    assert all(np.array_equal(a.mbps, b.mbps) for a, b in zip(first, again, strict=True))
    assert all(t.mbps.dtype == np.float64 and t.mbps.min() >= 0 < t.mbps.max() for t in first)


def test_flash_users_are_read_as_kilobytes_per_second(data_root: Path) -> None:
    users = flash_users(data_root)
    assert users.shape == (19, 4) and users.dtype == np.float64
    # README: median mean speeds 4318 KB/s down, 3286 KB/s up -> x 8e3 / 1e6 Mbit/s
    assert np.median(users[:, 0]) == pytest.approx(4318 * 0.008, rel=1e-3)
    assert np.median(users[:, 2]) == pytest.approx(3286 * 0.008, rel=1e-3)
    assert users[0].tolist() == pytest.approx([59.9312, 26.954384, 39.4816, 22.138552])


def test_compute_scores_are_the_cpu_float_scores(data_root: Path) -> None:
    scores = compute_scores(data_root)
    assert scores.shape == (333,) and (scores > 0).all()
    assert np.median(scores) == 1548  # README: cpu_fp_score p50 1548 (ai_score's is 5063)
    p10, p90 = np.quantile(scores, [0.1, 0.9])
    assert p90 / p10 == pytest.approx(12.4, abs=0.1)


def test_missing_files_and_unknown_sources_name_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"throughput_1s\.csv: no such file"):
        link_traces(tmp_path, "mahimahi", "up")
    with pytest.raises(InputError, match=r"'lumos'.*allowed: mahimahi, fivegophers"):
        link_traces(tmp_path, "lumos", "down")
    with pytest.raises(InputError, match=r"network_speed\.csv: no such file"):
        flash_users(tmp_path)
    with pytest.raises(InputError, match=r"ai_benchmark_devices\.csv: no such file"):
        compute_scores(tmp_path)


def test_a_damaged_trace_file_is_refused(tmp_path: Path, data_root: Path) -> None:
    folder = tmp_path / "traces" / "mahimahi_cellular"
    folder.mkdir(parents=True)
    source = data_root / "traces" / "mahimahi_cellular"
    (folder / "summary.csv").write_bytes((source / "summary.csv").read_bytes())
    lines = (source / "throughput_1s.csv").read_text().splitlines()
    (folder / "throughput_1s.csv").write_text("\n".join([*lines[:5], *lines[6:]]) + "\n")
    with pytest.raises(InputError, match=r"ATT-LTE-driving-2016\.down: t_s is not 0, 1, 2"):
        link_traces(tmp_path, "mahimahi", "down")
    lines[3] = lines[3].rsplit(",", 1)[0] + ",-1.0"
    (folder / "throughput_1s.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError, match=r"column capacity_mbps, row \d+: -1.0 \(expected >= 0\)"):
        link_traces(tmp_path, "mahimahi", "down")


# --- the user's client table --------------------------------------------------------------------

GOOD = (
    "client_id,down_mbps,up_mbps,compute_speed,availability,latency_s\n"
    "3,50.0,10.0,1.0,0.9,0.05\n"
    "0,20,2.5,0.25,1,0\n"
    "7,110.6,14,2.0,0.0,0.1\n"
)


def test_a_client_table_round_trips_through_csv_and_parquet(tmp_path: Path) -> None:
    csv = tmp_path / "clients.csv"
    csv.write_text(GOOD)
    table = read_client_table(csv)
    assert table.client_id.tolist() == [3, 0, 7] and table.client_id.dtype == np.int64
    assert table.down_mbps.tolist() == [50.0, 20.0, 110.6]
    assert table.up_mbps.tolist() == [10.0, 2.5, 14.0]
    assert table.compute_speed.tolist() == [1.0, 0.25, 2.0]
    assert table.availability is not None and table.availability.tolist() == [0.9, 1.0, 0.0]
    assert table.latency_s is not None and table.latency_s.tolist() == [0.05, 0.0, 0.1]
    parquet = tmp_path / "clients.parquet"
    pl.read_csv(csv).write_parquet(parquet)
    again = read_client_table(parquet)
    for name in ClientTable.__dataclass_fields__:
        assert np.array_equal(getattr(table, name), getattr(again, name)), name
    (tmp_path / "bare.csv").write_text("client_id,down_mbps,up_mbps,compute_speed\n0,1,1,1\n")
    bare = read_client_table(tmp_path / "bare.csv")
    assert bare.availability is None and bare.latency_s is None


HEADER = "client_id,down_mbps,up_mbps,compute_speed,availability"


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("t.csv", "client_id,down_mbps,up_mbps\n0,1,1\n", r"missing column\(s\) compute_speed"),
        ("t.csv", HEADER + ",availabilty\n0,1,1,1,1,1\n", r"unknown column\(s\) availabilty"),
        ("t.csv", HEADER + "\n", "no rows"),
        ("t.csv", HEADER + "\n0,1,1,1,1\n1,fast,1,1,1\n", r"column down_mbps, row 2: 'fast'"),
        ("t.csv", HEADER + "\n0,1,,1,1\n", r"column up_mbps, row 1: 'empty' \(not a number"),
        ("t.csv", HEADER + "\n0,1,1,nan,1\n", r"column compute_speed, row 1: 'nan'"),
        ("t.csv", HEADER + "\n0,1,1,1,1\n1,0,1,1,1\n", r"down_mbps, row 2: 0.0 .*> 0"),
        ("t.csv", HEADER + "\n0,1,-3,1,1\n", r"up_mbps, row 1: -3.0"),
        ("t.csv", HEADER + "\n0,inf,1,1,1\n", r"down_mbps, row 1: inf .*finite"),
        ("t.csv", HEADER + "\n0,1,1,0,1\n", r"compute_speed, row 1: 0.0"),
        ("t.csv", HEADER + "\n0,1,1,1,1.5\n", r"availability, row 1: 1.5 .*\[0, 1\]"),
        ("t.csv", HEADER + ",latency_s\n0,1,1,1,1,-0.1\n", r"latency_s, row 1: -0.1 .*>= 0"),
        ("t.csv", HEADER + "\n0,1,1,1,1\n0,2,2,2,1\n", r"client_id, row 2: 0 \(already in row 1"),
        ("t.csv", HEADER + "\n-1,1,1,1,1\n", r"client_id, row 1: -1 .*integers >= 0"),
        ("t.csv", HEADER + "\n1.5,1,1,1,1\n", r"client_id, row 1: 1.5"),
        ("t.csv", HEADER + "\nx7,1,1,1,1\n", r"client_id, row 1: 'x7'"),
        ("t.tsv", HEADER + "\n0,1,1,1,1\n", r"must be a \.csv or \.parquet file \(got '\.tsv'\)"),
        ("t.parquet", "not parquet", "cannot read it as parquet"),
    ],
)
def test_every_bad_client_table_is_one_clear_error(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError, match=message) as err:
        read_client_table(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_parquet_client_table_is_checked_like_a_csv(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    frame = pl.DataFrame(
        {"client_id": [0, 1], "down_mbps": [1.0, None], "up_mbps": [1.0, 1.0]}
    ).with_columns(compute_speed=pl.lit(1.0))
    frame.write_parquet(path)
    with pytest.raises(InputError, match="column down_mbps, row 2: 'empty'"):
        read_client_table(path)
    frame.with_columns(down_mbps=pl.lit(True)).write_parquet(path)
    with pytest.raises(InputError, match="column down_mbps holds Boolean values"):
        read_client_table(path)
    with pytest.raises(InputError, match="no such file"):
        read_client_table(tmp_path / "absent.csv")


# --- availability windows ----------------------------------------------------------------------


def test_windows_round_trip_and_answer_online(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("client_id,start_s,end_s\n2,100,200\n0,0,50\n2,0,10\n2,10,20\n5,30,inf\n")
    windows = read_windows(path)
    assert windows.client_id.tolist() == [0, 2, 2, 2, 5]  # sorted by (client, start)
    assert windows.start_s.tolist() == [0, 0, 10, 100, 30]
    cases = [
        (0, 0.0, True),
        (0, 49.9, True),
        (0, 50.0, False),  # end exclusive
        (2, 10.0, True),  # windows may touch
        (2, 20.0, False),
        (2, 99.9, False),
        (2, 100.0, True),  # start inclusive
        (2, 250.0, False),
        (5, 1e9, True),
        (1, 0.0, False),  # no row: never online
        (9, 5.0, False),
    ]
    assert [windows.online(c, t) for c, t, _ in cases] == [want for _, _, want in cases]
    mask = windows.online_mask(np.array([0, 1, 2, 5]), 5.0)
    assert mask.tolist() == [True, False, True, False]
    assert windows.fraction_online(2, 200.0) == pytest.approx(120 / 200)
    parquet = tmp_path / "w.parquet"
    pl.read_csv(path).write_parquet(parquet)
    again = read_windows(parquet)
    assert np.array_equal(windows.end_s, again.end_s) and again.period_s is None


def test_periodic_windows_repeat(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("client_id,start_s,end_s,period_s\n4,10,20,100\n4,50,100,100\n")
    windows = read_windows(path)
    assert [windows.online(4, t) for t in (15, 115, 215, 25, 125, 199.9, 200)] == [
        True,
        True,
        True,
        False,
        False,
        True,
        False,
    ]
    assert windows.fraction_online(4, 250.0) == pytest.approx(
        (2 * 60 + 10) / 250
    )  # 2 periods + [10, 20)


W_HEADER = "client_id,start_s,end_s"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("client_id,start_s\n0,1\n", r"missing column\(s\) end_s"),
        (W_HEADER + ",stop_s\n0,1,2,3\n", r"unknown column\(s\) stop_s"),
        (W_HEADER + "\n", "no rows"),
        (W_HEADER + "\n0,soon,2\n", r"column start_s, row 1: 'soon'"),
        (W_HEADER + "\n0,1,\n", r"column end_s, row 1: 'empty'"),
        (W_HEADER + "\n0,0,5\n0,-1,2\n", r"row 2: start_s -1.0 is not allowed .*>= 0"),
        (W_HEADER + "\n0,0,5\n1,7,7\n", r"row 2: end_s 7.0 is not after start_s 7.0"),
        (W_HEADER + "\n0,0,5\n1,9,3\n", r"row 2: end_s 3.0 is not after start_s 9.0"),
        (W_HEADER + "\n0,0,5\n0,4,8\n", r"row 2: client 0: window \[4.0, 8.0\) overlaps"),
        (W_HEADER + "\n-2,0,5\n", r"client_id, row 1: -2"),
        (W_HEADER + ",period_s\n0,0,5,0\n", r"row 1: period_s 0.0 is not allowed"),
        (W_HEADER + ",period_s\n0,0,5,10\n0,6,8,20\n", r"row 2: client 0: period_s 20.0 differs"),
        (W_HEADER + ",period_s\n0,0,15,10\n", r"row 1: end_s 15.0 is after period_s 10.0"),
    ],
)
def test_every_bad_windows_file_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "w.csv"
    path.write_text(text)
    with pytest.raises(InputError, match=message) as err:
        read_windows(path)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_windows_built_in_code_are_checked_too() -> None:
    with pytest.raises(ValueError, match="overlaps"):
        Windows(np.array([1, 1]), np.array([0.0, 5.0]), np.array([10.0, 20.0]))
    ok = Windows(np.array([1, 0]), np.array([5.0, 0.0]), np.array([6.0, 1.0]))
    assert ok.client_id.tolist() == [0, 1] and ok.online(1, 5.5) and not ok.online(0, 1.0)
