"""A user's own client table and availability windows (CSV or parquet), validated cell by cell.

Two formats (``docs/traces.md``), one row per client or per online interval:

- client table: ``client_id, down_mbps, up_mbps, compute_speed[, availability, latency_s]``;
- windows: ``client_id, start_s, end_s[, period_s]``: the client is online from ``start_s``
  (inclusive) to ``end_s`` (exclusive), in simulated seconds from the run's start; with
  ``period_s`` the client's windows repeat every ``period_s`` seconds (FedScale's behaviour
  traces loop that way).

Every bad cell is an :class:`~fedcomm.errors.InputError` naming the file, the column, the row
(1-based, the header not counted) and the value, and saying what is allowed. Unknown columns are
refused too, so that a misspelt optional column (``availabilty``) is not silently ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from fedcomm.errors import InputError, one_line

CLIENT_COLUMNS = ("client_id", "down_mbps", "up_mbps", "compute_speed")
CLIENT_OPTIONAL = ("availability", "latency_s")
WINDOW_COLUMNS = ("client_id", "start_s", "end_s")
WINDOW_OPTIONAL = ("period_s",)
_EXACT_INT = 2.0**53  # float64 holds every integer below this exactly


@dataclass(frozen=True)
class ClientTable:
    """A user's clients, one row each (``read_client_table``)."""

    client_id: np.ndarray  # int64 [n], distinct, >= 0
    down_mbps: np.ndarray  # float64 [n] > 0, Mbit/s (1e6 bit/s)
    up_mbps: np.ndarray  # float64 [n] > 0, Mbit/s
    compute_speed: np.ndarray  # float64 [n] > 0, a multiple of the reference device
    availability: np.ndarray | None  # float64 [n] in [0, 1], or None when the column is absent
    latency_s: np.ndarray | None  # float64 [n] >= 0 seconds per message, or None

    def __post_init__(self) -> None:
        n = len(self.client_id)
        for name in (*CLIENT_COLUMNS, *CLIENT_OPTIONAL):
            column = getattr(self, name)
            if column is not None and column.shape != (n,):
                raise ValueError(f"ClientTable.{name}: shape {column.shape}, expected ({n},)")

    def __len__(self) -> int:
        return len(self.client_id)


@dataclass(frozen=True)
class Windows:
    """Online intervals per client (``read_windows``). A client with no row is never online.

    Rows are kept sorted by ``(client_id, start_s)``; one client's windows do not overlap (they
    may touch: ``end_s`` of one = ``start_s`` of the next). With ``period_s`` (one value per
    client, every ``end_s <= period_s``) a client's windows repeat every ``period_s`` seconds.
    """

    client_id: np.ndarray  # int64 [m], >= 0
    start_s: np.ndarray  # float64 [m], >= 0: online from start_s (inclusive)
    end_s: np.ndarray  # float64 [m] > start_s: to end_s (exclusive); inf = for ever
    period_s: np.ndarray | None = None  # float64 [m] > 0, constant per client, or None

    def __post_init__(self) -> None:
        ids = np.asarray(self.client_id, dtype=np.int64)
        start = np.asarray(self.start_s, dtype=np.float64)
        end = np.asarray(self.end_s, dtype=np.float64)
        period = None if self.period_s is None else np.asarray(self.period_s, dtype=np.float64)
        if not (ids.ndim == 1 and start.shape == ids.shape == end.shape) or (
            period is not None and period.shape != ids.shape
        ):
            raise ValueError("Windows: client_id, start_s, end_s (and period_s) need one shape")
        order = np.lexsort((start, ids))
        ids, start, end = ids[order], start[order], end[order]
        period = None if period is None else period[order]
        problem = window_problem(ids, start, end, period)
        if problem is not None:
            raise ValueError(f"Windows: {problem[1]}")
        object.__setattr__(self, "client_id", ids)
        object.__setattr__(self, "start_s", start)
        object.__setattr__(self, "end_s", end)
        object.__setattr__(self, "period_s", period)

    def __len__(self) -> int:
        return len(self.client_id)

    def online(self, client_id: int, t_s: float) -> bool:
        """Whether ``client_id`` is online at simulated time ``t_s`` (False if it has no row)."""
        lo = int(np.searchsorted(self.client_id, client_id, side="left"))
        hi = int(np.searchsorted(self.client_id, client_id, side="right"))
        if lo == hi:
            return False
        t = float(t_s) if self.period_s is None else float(t_s) % float(self.period_s[lo])
        # the last window starting at or before t is the only one that can hold it
        k = lo + int(np.searchsorted(self.start_s[lo:hi], t, side="right")) - 1
        return k >= lo and t < float(self.end_s[k])

    def offline_at(self, client_id: int, t_s: float) -> float:
        """When ``client_id``, online at simulated time ``t_s``, goes offline: the end of the
        window holding ``t_s``, windows that touch joined (across periods too; ``inf``: never);
        ``t_s`` itself if it is offline then."""
        if not self.online(client_id, t_s):
            return float(t_s)
        lo = int(np.searchsorted(self.client_id, client_id, side="left"))
        hi = int(np.searchsorted(self.client_id, client_id, side="right"))
        start, end = self.start_s[lo:hi], self.end_s[lo:hi]
        t = float(t_s)
        if self.period_s is None:
            k = int(np.searchsorted(start, t, side="right")) - 1
            while k + 1 < len(start) and start[k + 1] == end[k]:
                k += 1
            return float(end[k])
        period = float(self.period_s[lo])
        base = (t // period) * period
        k = int(np.searchsorted(start, t - base, side="right")) - 1
        for _ in range(2 * len(start) + 1):  # at most one full turn of the period's windows
            nxt = k + 1
            if nxt < len(start):
                joined = bool(start[nxt] == end[k])
            else:  # the period's last window: joined to the next period's first at 0
                joined = bool(end[k] >= period and start[0] == 0.0)
            if not joined:
                return base + float(end[k])
            if nxt == len(start):
                base, nxt = base + period, 0
            k = nxt
        return math.inf  # online the whole period round

    def online_mask(self, client_ids: np.ndarray, t_s: float) -> np.ndarray:
        """``online`` for each of ``client_ids`` (int [n]) -> bool [n]."""
        return np.fromiter((self.online(int(c), t_s) for c in client_ids), bool, len(client_ids))

    def fraction_online(self, client_id: int, horizon_s: float) -> float:
        """The share of ``[0, horizon_s)`` that ``client_id`` is online (0.0 with no row)."""
        lo = int(np.searchsorted(self.client_id, client_id, side="left"))
        hi = int(np.searchsorted(self.client_id, client_id, side="right"))
        if lo == hi or horizon_s <= 0:
            return 0.0
        start, end = self.start_s[lo:hi], self.end_s[lo:hi]
        if self.period_s is None:
            covered = np.clip(np.minimum(end, horizon_s) - start, 0.0, None).sum()
            return float(covered / horizon_s)
        period = float(self.period_s[lo])
        whole, rest = divmod(float(horizon_s), period)
        covered = whole * float((end - start).sum())
        covered += float(np.clip(np.minimum(end, rest) - start, 0.0, None).sum())
        return covered / float(horizon_s)


def window_problem(
    ids: np.ndarray, start: np.ndarray, end: np.ndarray, period: np.ndarray | None
) -> tuple[int, str] | None:
    """The first broken rule of windows sorted by ``(client_id, start)``: ``(row, message)``."""
    checks: list[tuple[np.ndarray, Callable[[int], str]]] = [
        (ids < 0, lambda i: f"client_id {ids[i]} is negative (allowed: integers >= 0)"),
        (
            ~(np.isfinite(start) & (start >= 0)),
            lambda i: f"start_s {start[i]} is not allowed (allowed: finite seconds >= 0)",
        ),
        (
            np.isnan(end) | (end <= start),
            lambda i: f"end_s {end[i]} is not after start_s {start[i]} (allowed: end_s > start_s)",
        ),
    ]
    same = ids[1:] == ids[:-1]
    overlap = np.concatenate([[False], same & (start[1:] < end[:-1])])
    checks.append(
        (
            overlap,
            lambda i: (
                f"client {ids[i]}: window [{start[i]}, {end[i]}) overlaps "
                f"[{start[i - 1]}, {end[i - 1]}) (allowed: one client's windows do not overlap)"
            ),
        )
    )
    if period is not None:
        changes = np.concatenate([[False], same & (period[1:] != period[:-1])])
        checks += [
            (
                ~(np.isfinite(period) & (period > 0)),
                lambda i: f"period_s {period[i]} is not allowed (allowed: finite seconds > 0)",
            ),
            (
                changes,
                lambda i: (
                    f"client {ids[i]}: period_s {period[i]} differs from its other rows' "
                    f"{period[i - 1]} (allowed: one period per client)"
                ),
            ),
            (
                end > period,
                lambda i: (
                    f"end_s {end[i]} is after period_s {period[i]} "
                    "(allowed: windows inside one period)"
                ),
            ),
        ]
    for bad, message in checks:
        rows = np.flatnonzero(bad)
        if len(rows):
            return int(rows[0]), message(int(rows[0]))
    return None


# --- reading ------------------------------------------------------------------------------------


def read_frame(path: Path, what: str) -> pl.DataFrame:
    """A CSV (every cell read as text, parsed per column later) or parquet file, by suffix."""
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".parquet"):
        raise InputError(f"{path}: {what} must be a .csv or .parquet file (got {suffix!r})")
    if not path.is_file():
        raise InputError(f"{path}: no such file ({what})")
    try:
        if suffix == ".csv":
            return pl.read_csv(path, infer_schema=False)
        return pl.read_parquet(path)
    except (pl.exceptions.PolarsError, OSError, ValueError) as err:
        raise InputError(f"{path}: cannot read it as {suffix[1:]} ({one_line(err)})") from None


def _check_columns(
    frame: pl.DataFrame, path: Path, required: tuple[str, ...], optional: tuple[str, ...]
) -> None:
    allowed = f"required {', '.join(required)}; optional {', '.join(optional)}"
    missing = [c for c in required if c not in frame.columns]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)} ({allowed})")
    unknown = [c for c in frame.columns if c not in (*required, *optional)]
    if unknown:
        raise InputError(f"{path}: unknown column(s) {', '.join(unknown)} ({allowed})")
    if frame.height == 0:
        raise InputError(f"{path}: no rows")


def _cell_error(path: Path, column: str, row: int, value: object, allowed: str) -> InputError:
    return InputError(f"{path}: column {column}, row {row + 1}: {value!r} ({allowed})")


def _floats(frame: pl.DataFrame, path: Path, column: str, allowed: str) -> np.ndarray:
    """Column ``column`` as float64 [n]; a cell that is no number (or empty, or NaN) -> error."""
    raw = frame[column]
    if raw.dtype == pl.String:
        parsed = raw.str.strip_chars().cast(pl.Float64, strict=False)
    elif raw.dtype.is_numeric():
        parsed = raw.cast(pl.Float64)
    else:
        raise InputError(f"{path}: column {column} holds {raw.dtype} values ({allowed})")
    values = parsed.to_numpy().astype(np.float64, copy=False)
    bad = np.flatnonzero(parsed.is_null().to_numpy() | np.isnan(values))
    if len(bad):
        i = int(bad[0])
        shown = raw[i] if raw[i] is not None else "empty"
        raise _cell_error(path, column, i, shown, f"not a number; {allowed}")
    return values


def _require(
    values: np.ndarray, ok: np.ndarray, path: Path, column: str, allowed: str
) -> np.ndarray:
    bad = np.flatnonzero(~ok)
    if len(bad):
        raise _cell_error(path, column, int(bad[0]), values[bad[0]].item(), allowed)
    return values


def _client_ids(frame: pl.DataFrame, path: Path, *, distinct: bool) -> np.ndarray:
    allowed = "allowed: integers >= 0" + (", each once" if distinct else "")
    raw = frame["client_id"]
    if raw.dtype.is_integer():
        if raw.null_count():
            row = int(raw.is_null().arg_true()[0])
            raise _cell_error(path, "client_id", row, "empty", allowed)
        ids = raw.cast(pl.Int64).to_numpy()
    else:
        values = _floats(frame, path, "client_id", allowed)
        integral = (values == np.floor(values)) & (np.abs(values) < _EXACT_INT)
        ids = _require(values, integral, path, "client_id", allowed).astype(np.int64)
    _require(ids, ids >= 0, path, "client_id", allowed)
    if distinct:
        _, first = np.unique(ids, return_index=True)
        repeats = np.setdiff1d(np.arange(len(ids)), first)
        if len(repeats):
            i = int(repeats[0])
            earlier = int(np.flatnonzero(ids == ids[i])[0])
            raise _cell_error(
                path, "client_id", i, int(ids[i]), f"already in row {earlier + 1}; {allowed}"
            )
    return ids


def read_client_table(path: Path) -> ClientTable:
    """A user's client table (CSV or parquet): ``client_id`` (distinct integers >= 0),
    ``down_mbps`` and ``up_mbps`` (Mbit/s > 0), ``compute_speed`` (> 0, a multiple of the
    reference device) and optionally ``availability`` (probability in [0, 1] of being online
    when sampled) and ``latency_s`` (seconds >= 0 per message)."""
    frame = read_frame(path, "client table")
    _check_columns(frame, path, CLIENT_COLUMNS, CLIENT_OPTIONAL)
    ids = _client_ids(frame, path, distinct=True)

    def column(name: str, allowed: str, ok: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
        values = _floats(frame, path, name, f"allowed: {allowed}")
        return _require(values, ok(values), path, name, f"allowed: {allowed}")

    def positive(name: str) -> np.ndarray:
        return column(name, "finite numbers > 0", lambda v: np.isfinite(v) & (v > 0))

    return ClientTable(
        client_id=ids,
        down_mbps=positive("down_mbps"),
        up_mbps=positive("up_mbps"),
        compute_speed=positive("compute_speed"),
        availability=(
            column("availability", "probabilities in [0, 1]", lambda v: (v >= 0) & (v <= 1))
            if "availability" in frame.columns
            else None
        ),
        latency_s=(
            column("latency_s", "finite seconds >= 0", lambda v: np.isfinite(v) & (v >= 0))
            if "latency_s" in frame.columns
            else None
        ),
    )


def read_windows(path: Path) -> Windows:
    """Online windows (CSV or parquet): ``client_id, start_s, end_s`` and optionally
    ``period_s``; see :class:`Windows` for the rules, each checked with the file's row named."""
    frame = read_frame(path, "availability windows")
    _check_columns(frame, path, WINDOW_COLUMNS, WINDOW_OPTIONAL)
    ids = _client_ids(frame, path, distinct=False)
    start = _floats(frame, path, "start_s", "allowed: finite seconds >= 0")
    end = _floats(frame, path, "end_s", "allowed: seconds > start_s")
    period = (
        _floats(frame, path, "period_s", "allowed: finite seconds > 0")
        if "period_s" in frame.columns
        else None
    )
    order = np.lexsort((start, ids))
    problem = window_problem(
        ids[order], start[order], end[order], None if period is None else period[order]
    )
    if problem is not None:
        row, message = problem
        raise InputError(f"{path}: row {int(order[row]) + 1}: {message}")
    return Windows(ids, start, end, period)
