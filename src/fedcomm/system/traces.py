"""Real measurements under the data root's ``traces/`` (``docs/traces.md``), and user tables.

- :func:`link_traces`: per-second link capacity, Mbit/s (Mahimahi's cellular up/down links,
  5Gophers' 5G downlinks); :func:`mahimahi_technologies`: each Mahimahi trace's technology;
- :func:`flash_users`: FLASH's 19 real FL-app users' up/down speed, mean and std, Mbit/s;
- :func:`compute_scores`: AI-Benchmark scores of 333 phone models (relative compute);
- :func:`read_client_table`, :func:`read_windows`: a user's own table (:mod:`.tables`).

Each reader checks the file it reads and raises :class:`~fedcomm.errors.InputError` naming it.
Nothing here draws anything: the population (``system/population.py``) draws from the seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import polars as pl

from fedcomm.errors import InputError, one_line
from fedcomm.system.tables import (
    ClientTable,
    Windows,
    read_client_table,
    read_windows,
)

__all__ = [
    "TRACE_SOURCES",
    "ClientTable",
    "Trace",
    "Windows",
    "compute_scores",
    "flash_users",
    "link_traces",
    "mahimahi_technologies",
    "read_client_table",
    "read_windows",
]

TRACE_SOURCES = ("mahimahi", "fivegophers")  # per-second link-capacity time series
MAHIMAHI = Path("traces/mahimahi_cellular")
FIVEGOPHERS = Path("traces/fivegophers_5g")
FLASH = Path("traces/flash_device")
KB_TO_MBIT = 8e3 / 1e6  # FLASH's 'kb/s' read as kilobytes (1000 B) per second -> Mbit/s
COMPUTE_COLUMN = "cpu_fp_score"  # AI-Benchmark's CPU float score (see compute_scores)


@dataclass(frozen=True)
class Trace:
    """One link's capacity, second by second."""

    name: str  # "<source>/<trace>", e.g. "mahimahi/ATT-LTE-driving.up"
    mbps: np.ndarray  # float64 [seconds]: Mbit/s (1e6 bit/s) of each 1-s bin, >= 0, some > 0

    def __post_init__(self) -> None:
        if self.mbps.ndim != 1 or not len(self.mbps) or not float(self.mbps.max()) > 0:
            raise ValueError(f"trace {self.name}: needs at least one second of capacity > 0")


def _read_csv(path: Path, columns: dict[str, type[pl.DataType]]) -> pl.DataFrame:
    """The ``columns`` of a CSV with those types; a missing file/column or bad cell -> error."""
    if not path.is_file():
        raise InputError(f"{path}: no such file (the offline traces; see docs/traces.md)")
    try:
        frame = pl.read_csv(path, infer_schema=False)
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
        return frame.select(pl.col(c).cast(t, strict=True) for c, t in columns.items())
    except pl.exceptions.PolarsError as err:
        raise InputError(f"{path}: unreadable ({one_line(err)})") from None


def _check_finite(path: Path, column: str, values: np.ndarray, *, positive: bool) -> None:
    ok = np.isfinite(values) & ((values > 0) if positive else (values >= 0))
    if not ok.all():
        i = int(np.flatnonzero(~ok)[0])
        allowed = "> 0" if positive else ">= 0"
        raise InputError(f"{path}: column {column}, row {i + 1}: {values[i]} (expected {allowed})")


def _mahimahi(root: Path, direction: str) -> list[Trace]:
    """Mahimahi's 1-s bins of one direction, each trace's partial last second left out.

    ``throughput_1s.csv`` counts the packets of each second ``[t, t + 1)`` up to the trace's
    last timestamp; its last bin usually covers only part of a second (``summary.csv``'s
    ``duration_s``, e.g. 0.113 s of ATT-LTE-driving.down) and would read as a near-outage, so
    only the ``floor(duration_s)`` whole seconds are kept.
    """
    path = root / MAHIMAHI / "throughput_1s.csv"
    bins = _read_csv(
        path,
        {"trace": pl.String, "direction": pl.String, "t_s": pl.Int64, "capacity_mbps": pl.Float64},
    ).filter(pl.col("direction") == direction)
    _check_finite(path, "capacity_mbps", bins["capacity_mbps"].to_numpy(), positive=False)
    summary_path = root / MAHIMAHI / "summary.csv"
    summary = _read_csv(
        summary_path, {"trace": pl.String, "direction": pl.String, "duration_s": pl.Float64}
    ).filter(pl.col("direction") == direction)
    durations = dict(zip(summary["trace"], summary["duration_s"], strict=True))
    traces = []
    for (stem,), group in bins.group_by("trace"):
        group = group.sort("t_s")
        t = group["t_s"].to_numpy()
        if not np.array_equal(t, np.arange(len(t))):
            raise InputError(f"{path}: trace {stem}.{direction}: t_s is not 0, 1, 2, ... (damaged)")
        if stem not in durations:
            raise InputError(f"{summary_path}: no row for trace {stem}.{direction}")
        whole = int(np.floor(durations[stem]))
        if not 0 < whole <= len(t):
            raise InputError(
                f"{summary_path}: {stem}.{direction}: duration_s {durations[stem]} does not "
                f"match its {len(t)} bins in {path.name}"
            )
        mbps = group["capacity_mbps"].to_numpy()[:whole]
        traces.append(Trace(f"mahimahi/{stem}.{direction}", mbps))
    return sorted(traces, key=lambda tr: tr.name)


def _fivegophers(root: Path) -> list[Trace]:
    """5Gophers' 120 runs, one trace each, in ``seq_num`` order.

    Two runs lack one second each (run 22: second 32; run 29: second 47); their present
    seconds are kept in order, the gap closed (nothing is filled in).
    """
    path = root / FIVEGOPHERS / "original" / "throughput.csv"
    rows = _read_csv(
        path,
        {
            "carrier": pl.String,
            "num_tcp_conn": pl.Int64,
            "server_location": pl.String,
            "run_num": pl.Int64,
            "seq_num": pl.Int64,
            "throughput_mbps": pl.Float64,
        },
    )
    _check_finite(path, "throughput_mbps", rows["throughput_mbps"].to_numpy(), positive=False)
    keys = ["carrier", "num_tcp_conn", "server_location", "run_num"]
    traces = []
    for (carrier, conns, site, run), group in rows.group_by(keys):
        name = f"fivegophers/{carrier}-{conns}conn-{site}-run{int(run):03d}"
        seq = group["seq_num"].to_numpy()
        if len(np.unique(seq)) != len(seq):
            raise InputError(f"{path}: {name}: a seq_num repeats (damaged)")
        traces.append(Trace(name, group.sort("seq_num")["throughput_mbps"].to_numpy()))
    return sorted(traces, key=lambda tr: tr.name)


def link_traces(root: Path, source: str, direction: Literal["up", "down"]) -> list[Trace]:
    """The per-second capacity traces of ``source`` for ``direction``, sorted by name.

    ``root`` is the data root (``FEDCOMM_DATA_ROOT``). Seconds of zero capacity are real
    outages and are kept (a transfer waits through them); every trace has some second > 0.
    ``mahimahi``: 7 downlink and 6 uplink traces; ``fivegophers``: 120 runs, whose direction the
    dataset does not label (values up to ~2 Gbit/s: evidently downlink), so only ``down``.
    """
    if source not in TRACE_SOURCES:
        allowed = ", ".join(TRACE_SOURCES)
        raise InputError(f"trace source {source!r} is unknown (allowed: {allowed})")
    if direction not in ("up", "down"):
        raise InputError(f"trace direction {direction!r} is unknown (allowed: up, down)")
    if source == "fivegophers":
        if direction == "up":
            raise InputError(
                "trace source 'fivegophers' has no uplink: 5Gophers does not label the "
                "direction and its rates (up to ~2 Gbit/s) are evidently downlink; use it for "
                "links.down only (uplink: mahimahi, flash, or a distribution)"
            )
        traces = _fivegophers(root)
    else:
        traces = _mahimahi(root, direction)
    if not traces:
        raise InputError(f"{root / 'traces'}: no {source} traces for direction {direction!r}")
    return traces


def mahimahi_technologies(root: Path, direction: Literal["up", "down"]) -> dict[str, str]:
    """Each Mahimahi trace's radio technology (``summary.csv``'s ``technology``, lower case:
    ``lte``, ``umts``, ``evdo``), by its :class:`Trace` name (``mahimahi/<trace>.<direction>``)."""
    path = root / MAHIMAHI / "summary.csv"
    rows = _read_csv(
        path, {"trace": pl.String, "direction": pl.String, "technology": pl.String}
    ).filter(pl.col("direction") == direction)
    return {
        f"mahimahi/{stem}.{direction}": tech.lower()
        for stem, tech in zip(rows["trace"], rows["technology"], strict=True)
    }


def flash_users(root: Path) -> np.ndarray:
    """FLASH's real FL-app users' link speeds: float64 [users, 4] of ``down_mean, down_std,
    up_mean, up_std`` in Mbit/s (19 users), from ``flash_device/network_speed.csv``.

    FLASH's simulator (``models/device.py``) says its speeds are in 'kb/s' and uses them as
    kiloBYTES per second (model bytes / 1024 / speed on the download path, / 1000 on the
    upload path); we read them as kilobytes of 1000 B: Mbit/s = value x 8e3 / 1e6. (Read as
    KiB/s every value would be 2.4% higher; read as kilobits, 8x lower.)
    """
    path = root / FLASH / "network_speed.csv"
    columns = ("down_mean_KBps", "down_std_KBps", "up_mean_KBps", "up_std_KBps")
    frame = _read_csv(path, dict.fromkeys(columns, pl.Float64))
    for name in columns:
        positive = name.endswith("mean_KBps")
        _check_finite(path, name, frame[name].to_numpy(), positive=positive)
    return frame.select(columns).to_numpy().astype(np.float64) * KB_TO_MBIT


def compute_scores(root: Path) -> np.ndarray:
    """AI-Benchmark's CPU float score of each phone model: float64 [333] > 0, benchmark points
    (higher = faster), from ``flash_device/ai_benchmark_devices.csv`` in its rank order.

    Why ``cpu_fp_score``: on-device FL training runs float32 back-propagation on the phone's CPU
    (mobile NN accelerators and their int8/fp16 paths serve inference), and ``cpu_fp_score`` is
    the benchmark's float-on-CPU score; the overall ``ai_score`` mixes in quantised and
    accelerator results (its p90/p10 spread is 38.9x against 12.4x). Scores are relative
    speeds, not seconds: the population divides them by their median.
    """
    path = root / FLASH / "ai_benchmark_devices.csv"
    scores = _read_csv(path, {COMPUTE_COLUMN: pl.Float64})[COMPUTE_COLUMN]
    if scores.null_count():
        row = int(scores.is_null().arg_true()[0])
        raise InputError(f"{path}: column {COMPUTE_COLUMN}, row {row + 1}: empty")
    values = scores.to_numpy().astype(np.float64)
    _check_finite(path, COMPUTE_COLUMN, values, positive=True)
    return values
