"""Accuracy against *simulated* time: the run summaries of a run that had a ``system`` section.

A run with a ``system`` section (simulated time) carries, on every round of its ``rounds`` table,
``time/sim_round_s`` (simulated seconds of the round: its deadline, or the last aggregated
client's finish), ``time/sim_elapsed_s`` (simulated seconds since the start of the run, after
this round) and the client counts ``system/sampled``, ``system/online``, ``system/finished``,
``system/dropped`` and ``system/partial``. A run without one has none of these columns, and
then every function here returns nothing (``None`` / ``{}``), so its summaries are exactly
what they were before simulated time existed.

A run whose ``system`` section had ``energy`` also carries the joules its clients spent
(:mod:`fedcomm.system.energy`): ``energy/round_j`` (every sampled client of the round, dropped ones
included) and its parts, and ``energy/cum_j`` since the run began; its summary gets ``energy``
(:func:`energy_run_stats`) and, per target, the joules spent until it was first reached. Without
these columns nothing of it appears.

The rules follow the communication budgets' (:func:`~.curve_points.best_within_budget`):

- accuracy at a time budget of ``h`` simulated hours = the **best** evaluated accuracy over the
  rounds whose ``time/sim_elapsed_s`` is at most ``3600·h`` (``None`` when no evaluation fits);
- simulated time to a target = ``time/sim_elapsed_s`` of the first round whose accuracy reaches
  the target, in hours (that round's own simulated time included: the model that reached the
  target exists only once the round is over; ``None`` when never reached).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import polars as pl

from fedcomm.evaluation.curve_points import json_key
from fedcomm.system.energy import COMPUTE_J, CUM_J, DOWN_J, DROPPED_J, ROUND_J, UP_J

SIM_ELAPSED = "time/sim_elapsed_s"
SIM_ROUND = "time/sim_round_s"
SYSTEM_COUNTS = (
    "system/sampled",
    "system/online",
    "system/finished",
    "system/dropped",
    "system/partial",
)
HOUR_S = 3600.0


def has_sim_time(frame: pl.DataFrame) -> bool:
    """True when ``frame`` has simulated elapsed time on at least one round."""
    if SIM_ELAPSED not in frame.columns:
        return False
    return bool(frame[SIM_ELAPSED].cast(pl.Float64).fill_nan(None).drop_nulls().len())


def _number(value: Any) -> float | None:
    """A JSON-safe float: ``None`` for null and NaN."""
    if value is None:
        return None
    out = float(value)
    return None if math.isnan(out) else out


def _evaluated(frame: pl.DataFrame, column: str, clock: str = SIM_ELAPSED) -> pl.DataFrame:
    """``round``, ``column`` and ``clock`` (elapsed seconds, or cumulative joules) of the rounds
    that evaluated ``column``, sorted by round."""
    return (
        frame.select(
            pl.col("round").cast(pl.Int32),
            pl.col(column).cast(pl.Float64).fill_nan(None),
            pl.col(clock).cast(pl.Float64).fill_nan(None),
        )
        .drop_nulls()
        .sort("round")
    )


def _at_target(frame: pl.DataFrame, column: str, target: float, clock: str) -> float | None:
    """``clock`` after the first round whose ``column`` reaches ``target`` (None if never)."""
    hit = _evaluated(frame, column, clock).filter(pl.col(column) >= target)
    return _number(hit[clock][0]) if hit.height else None


def best_within_time(frame: pl.DataFrame, column: str, budget_h: float) -> float | None:
    """The best ``column`` over the rounds whose simulated elapsed time is at most ``budget_h``
    hours (the rule of :func:`~.curve_points.best_within_budget`, on the simulated clock).

    Args:
        frame: a rounds table with ``round``, ``time/sim_elapsed_s`` and ``column``.
        column: the accuracy column.
        budget_h: the budget in simulated hours.

    Returns:
        The best value, or ``None`` when the run has no simulated time or no evaluation fits.
    """
    if column not in frame.columns or not has_sim_time(frame):
        return None
    within = _evaluated(frame, column).filter(pl.col(SIM_ELAPSED) <= budget_h * HOUR_S)
    return _number(within[column].max()) if within.height else None


def sim_hours_to_target(frame: pl.DataFrame, column: str, target: float) -> float | None:
    """Simulated hours until ``column`` first reaches ``target``: ``time/sim_elapsed_s`` / 3600 of
    the first round with ``column >= target`` (``None`` if never, or without simulated time)."""
    if column not in frame.columns or not has_sim_time(frame):
        return None
    seconds = _at_target(frame, column, target, SIM_ELAPSED)
    return None if seconds is None else seconds / HOUR_S


def has_energy(frame: pl.DataFrame) -> bool:
    """True when ``frame`` has the clients' joules on at least one round (``system.energy``)."""
    if CUM_J not in frame.columns:
        return False
    return bool(frame[CUM_J].cast(pl.Float64).fill_nan(None).drop_nulls().len())


def energy_to_target(frame: pl.DataFrame, column: str, target: float) -> float | None:
    """Joules the clients spent until ``column`` first reached ``target``: ``energy/cum_j`` of
    that round, the rule of :func:`sim_hours_to_target` (None if never, or without energy)."""
    if column not in frame.columns or not has_energy(frame):
        return None
    return _at_target(frame, column, target, CUM_J)


def energy_run_stats(rounds: pl.DataFrame) -> dict[str, float | None]:
    """The run's energy (the ``energy`` node of a run summary), joules: ``total_j`` (the last
    round's ``energy/cum_j``), ``round_j_mean``, ``down_j``, ``compute_j`` and ``up_j`` (summed
    over the rounds) and ``dropped_share`` (the part spent by clients that were not aggregated;
    None when nothing was spent)."""
    ordered = rounds.sort("round")
    cum = ordered[CUM_J].cast(pl.Float64).fill_nan(None).drop_nulls()
    spent = _sum(ordered, ROUND_J)
    return {
        "total_j": float(cum[-1]),
        "round_j_mean": _mean(ordered, ROUND_J),
        "down_j": _sum(ordered, DOWN_J),
        "compute_j": _sum(ordered, COMPUTE_J),
        "up_j": _sum(ordered, UP_J),
        "dropped_share": _sum(ordered, DROPPED_J) / spent if spent > 0 else None,
    }


def _mean(frame: pl.DataFrame, column: str) -> float | None:
    if column not in frame.columns:
        return None
    return _number(frame[column].cast(pl.Float64).fill_nan(None).mean())


def _sum(frame: pl.DataFrame, column: str) -> float:
    if column not in frame.columns:
        return 0.0
    return float(frame[column].cast(pl.Float64).fill_nan(None).sum())


def sim_run_stats(rounds: pl.DataFrame) -> dict[str, float | None]:
    """The run's simulated clock and client counts (the ``sim`` node of a run summary).

    Keys: ``elapsed_h`` (simulated hours of the whole run: the last round's
    ``time/sim_elapsed_s`` / 3600), ``round_s_mean`` (mean ``time/sim_round_s``), the mean per
    round of each client count (``sampled``, ``online``, ``finished``, ``dropped``, ``partial``;
    ``None`` for a count the run did not record) and ``dropped_share`` (dropped / sampled, summed
    over rounds; ``None`` when nothing was sampled).
    """
    ordered = rounds.sort("round")
    elapsed = ordered[SIM_ELAPSED].cast(pl.Float64).fill_nan(None).drop_nulls()
    out: dict[str, float | None] = {
        "elapsed_h": float(elapsed[-1]) / HOUR_S,
        "round_s_mean": _mean(ordered, SIM_ROUND),
    }
    for column in SYSTEM_COUNTS:
        out[column.removeprefix("system/")] = _mean(ordered, column)
    sampled = _sum(ordered, "system/sampled")
    out["dropped_share"] = _sum(ordered, "system/dropped") / sampled if sampled > 0 else None
    return out


def sim_time_summary(
    rounds: pl.DataFrame,
    *,
    time_budgets_h: Sequence[float] = (),
    targets: Sequence[float] = (),
    target_metric: str = "global/accuracy",
) -> dict[str, Any]:
    """The simulated-time parts of a run summary, ``{}`` for a run without simulated time.

    Returns:
        ``sim`` (:func:`sim_run_stats`), ``at_time_budget`` (``{hours: best accuracy within}``,
        only when ``time_budgets_h`` is given) and ``to_target_sim_h`` (``{target: simulated
        hours to reach it or None}``, only when ``targets`` is given); :func:`merge_sim_time`
        puts the latter into the summary's ``to_target`` nodes as ``sim_h``. With the clients'
        joules (``system.energy``) also ``energy`` (:func:`energy_run_stats`) and
        ``to_target_energy_j`` (merged as ``energy_j``).
    """
    if not has_sim_time(rounds):
        return {}
    out: dict[str, Any] = {"sim": sim_run_stats(rounds)}
    energy = has_energy(rounds)
    if energy:
        out["energy"] = energy_run_stats(rounds)
    if time_budgets_h:
        out["at_time_budget"] = {
            json_key(h): best_within_time(rounds, target_metric, h) for h in time_budgets_h
        }
    if targets:
        out["to_target_sim_h"] = {
            json_key(t): sim_hours_to_target(rounds, target_metric, t) for t in targets
        }
    if targets and energy:
        out["to_target_energy_j"] = {
            json_key(t): energy_to_target(rounds, target_metric, t) for t in targets
        }
    return out


TO_TARGET = {"to_target_sim_h": "sim_h", "to_target_energy_j": "energy_j"}  # -> to_target[t]


def merge_sim_time(summary: dict[str, Any], sim: dict[str, Any]) -> dict[str, Any]:
    """``summary`` (a :func:`~.summaries.summarize_run` output) with the parts of
    :func:`sim_time_summary` merged in: ``sim``, ``at_time_budget`` and ``energy`` as they are,
    each target's simulated hours as ``to_target[t]["sim_h"]`` (joules: ``energy_j``). A copy;
    ``summary`` unchanged when ``sim`` is empty (a run without simulated time)."""
    if not sim:
        return summary
    out = {**summary, **{k: v for k, v in sim.items() if k not in TO_TARGET}}
    for part, name in TO_TARGET.items():
        values = sim.get(part, {})
        if values:
            to_target = dict(out.get("to_target") or {})
            for key, v in values.items():
                to_target[key] = {**(to_target.get(key) or {}), name: v}
            out["to_target"] = to_target
    return out
