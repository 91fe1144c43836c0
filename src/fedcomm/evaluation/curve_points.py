"""Points read off a run's curve (a rounds or run table, one row per round): the last measured
value, the best value and the first round reaching it, the first round reaching a target, and
the best value within a communication budget. Unevaluated rounds (null or NaN) are skipped; every
value returned is JSON-safe (``None`` for none)."""

from __future__ import annotations

import math
from typing import Any

import polars as pl

# "final" = the mean of the last 5 evaluations, by default: evaluate.last_k, the claims rule's
# last_k, `fedcomm compare --last-k` (:func:`final_value`)
LAST_K = 5


def json_float(value: Any) -> float | None:
    """A JSON-safe float: ``None`` for null and NaN."""
    if value is None:
        return None
    out = float(value)
    return None if math.isnan(out) else out


def json_key(x: float) -> str:
    """A compact JSON key for a budget or target: ``0.5`` -> ``"0.5"``, ``1.0`` -> ``"1"`` (the
    keys of a summary's ``at_budget``, ``to_target``, ... and of ``gib_to_<t>``)."""
    return f"{x:g}"


def last_value(frame: pl.DataFrame, column: str) -> float | None:
    """The value of ``column`` in the last row (by round) where it is non-null and not NaN."""
    if column not in frame.columns:
        return None
    values = frame.sort("round")[column].fill_nan(None).drop_nulls()
    return json_float(values[-1]) if len(values) else None


def final_value(frame: pl.DataFrame, column: str, last_k: int) -> float | None:
    """ "Final": the mean of the last ``last_k`` values (by round) of ``column`` where it is
    non-null and not NaN (fewer when fewer were measured; ``last_k = 1``: :func:`last_value`).
    fedcomm's one meaning of a final accuracy: the decision rule's, the reports', the sweeps'."""
    if last_k < 1:
        raise ValueError(f"last_k must be >= 1 (got {last_k})")
    if column not in frame.columns:
        return None
    values = frame.sort("round")[column].cast(pl.Float64).fill_nan(None).drop_nulls()
    return json_float(values.tail(last_k).mean()) if len(values) else None


def best_value(frame: pl.DataFrame, column: str) -> tuple[float | None, int | None]:
    """The maximum of ``column`` and the first round reaching it (``(None, None)`` if none)."""
    if column not in frame.columns:
        return None, None
    valid = frame.select("round", pl.col(column).fill_nan(None)).drop_nulls().sort("round")
    if valid.is_empty():
        return None, None
    row = valid.row(int(valid[column].arg_max() or 0), named=True)
    return json_float(row[column]), int(row["round"])


def first_round_reaching(frame: pl.DataFrame, column: str, target: float) -> int | None:
    """The first round whose ``column`` is ``>= target``, or ``None``."""
    if column not in frame.columns:
        return None
    hit = frame.filter(pl.col(column).fill_nan(None) >= target).sort("round")  # NaN sorts high
    return int(hit["round"][0]) if hit.height else None


def _best_where(frame: pl.DataFrame, column: str, within: pl.Expr) -> float | None:
    """The maximum of ``column`` over the rows where ``within`` holds (``None`` if none)."""
    if column not in frame.columns:
        return None
    values = frame.filter(within)[column].fill_nan(None).drop_nulls()
    return json_float(values.max()) if len(values) else None


def best_within_budget(frame: pl.DataFrame, column: str, budget_gib: float) -> float | None:
    """The best ``column`` over rounds with ``cum_gib <= budget_gib`` (``None`` if none)."""
    return _best_where(frame, column, pl.col("cum_gib") <= budget_gib)
