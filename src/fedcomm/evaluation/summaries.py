"""Run summaries for DVC metrics: final, best, accuracy at budgets and upload caps, cost to reach
a target.

Inputs are the three tables a run writes (``rounds``, ``ledger``, ``clients``; schemas in
``simulation/loop.py``). :func:`run_table` joins to the rounds the communication measured by the
ledger (:mod:`.traffic`) and the modelled round time (:mod:`.round_time`); :func:`summarize_run`
reads the summary's points off that table (:mod:`.curve_points`, :mod:`.caps`) and adds the
simulated-time part of a run with a ``system`` section (:mod:`.sim_time`). Seeds are pooled by
:func:`.seeds.aggregate_seeds`.

Everything here is pure polars / python and the outputs are JSON-serialisable (NaN -> null).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import polars as pl

from fedcomm.comm.bits import GIB
from fedcomm.evaluation.caps import CapAxis, best_within_upload_cap
from fedcomm.evaluation.curve_points import (
    LAST_K,
    best_value,
    best_within_budget,
    final_value,
    first_round_reaching,
    json_float,
    json_key,
    last_value,
)
from fedcomm.evaluation.round_time import DEFAULT_LINK, LinkModel, round_seconds
from fedcomm.evaluation.sim_time import merge_sim_time, sim_time_summary
from fedcomm.evaluation.traffic import bytes_from_rounds, cumulative_at_rounds, cumulative_bytes

ACCURACY = "global/accuracy"
# averaged over the last k evaluations (evaluated metrics); the others are the last round's value
FINAL_MEANS = (
    "global/accuracy",
    "global/loss",
    "local/accuracy",
    "local/accuracy_weighted",
    "topk/accuracy",
)
_FINAL_LAST = ("local/coverage", "model/sparsity")


def _to_target(table: pl.DataFrame, column: str, target: float) -> dict[str, float | int | None]:
    """Round, GiB, bytes and modelled seconds until ``column`` first reaches ``target``."""
    r = first_round_reaching(table, column, target)
    if r is None:
        return {"round": None, "gib": None, "bytes": None, "tta_s": None}
    upto = table.filter(pl.col("round") <= r)
    return {
        "round": r,
        "gib": json_float(upto["cum_gib"][-1]),
        "bytes": json_float(upto["cum_bytes"][-1]),
        "tta_s": json_float(upto["round_s"].sum()),
    }


def _final(table: pl.DataFrame, last_k: int) -> dict[str, float | None]:
    """Accuracies and loss: the mean of their last ``last_k`` evaluations; coverage and sparsity:
    the last measured value; plus total communication (GiB) from the ledger."""
    out = {
        m: final_value(table, m, last_k)
        for m in FINAL_MEANS
        if m != "topk/accuracy" or m in table.columns  # top-k only where measured
    }
    out |= {m: last_value(table, m) for m in _FINAL_LAST}
    up = float(table["cum_up_bytes"][-1]) if table.height else 0.0
    down = float(table["cum_down_bytes"][-1]) if table.height else 0.0
    out["comm/cum_gib"] = (up + down) / GIB
    out["comm/up_gib"] = up / GIB
    out["comm/down_gib"] = down / GIB
    return out


def _best(table: pl.DataFrame) -> dict[str, float | int | None]:
    """Best global and local accuracy and the rounds they were first reached."""
    out: dict[str, float | int | None] = {}
    for metric in ("global/accuracy", "local/accuracy"):
        value, round_ = best_value(table, metric)
        out[metric] = value
        out[f"{metric}_round"] = round_
    return out


def _column(frame: pl.DataFrame, name: str) -> pl.Series:
    """``frame[name]`` with NaN as null, or an empty Float64 series when absent."""
    if name not in frame.columns:
        return pl.Series(name, [], dtype=pl.Float64)
    return frame[name].cast(pl.Float64).fill_nan(None)


def _time(rounds: pl.DataFrame, clients: pl.DataFrame) -> dict[str, float | None]:
    """Mean round time, LTTR (mean client training time) and total measured time."""
    round_s = _column(rounds, "time/round_s")
    client_s = _column(clients, "train_s") if clients.height else _column(rounds, "time/client_s")
    return {
        "round_s_mean": json_float(round_s.mean()),
        "client_s_mean": json_float(client_s.mean()),
        "total_s": float(round_s.sum()),
    }


def run_table(
    rounds: pl.DataFrame,
    ledger: pl.DataFrame,
    clients: pl.DataFrame,
    *,
    link: LinkModel = DEFAULT_LINK,
    server_s: pl.Series | None = None,
) -> pl.DataFrame:
    """``rounds`` sorted by round, with ledger-derived cumulative bytes/GiB and ``round_s``.

    Args:
        rounds: the run's per-round metrics.
        ledger: one row per message.
        clients: one row per (round, participating client).
        link: bandwidths for the modelled round time.
        server_s: optional server seconds per round (see :func:`round_seconds`).

    Returns:
        ``rounds`` plus ``cum_up_bytes``, ``cum_down_bytes``, ``cum_bytes``, ``cum_gib`` and
        ``round_s`` (modelled seconds of the round).
    """
    rounds = rounds.with_columns(pl.col("round").cast(pl.Int32)).sort("round")
    per_round = cumulative_bytes(ledger) if ledger.height else bytes_from_rounds(rounds)
    cum = cumulative_at_rounds(rounds["round"], per_round)
    times = round_seconds(rounds, ledger, clients, link=link, server_s=server_s)
    return rounds.join(cum, on="round", how="left").join(times, on="round", how="left")


def summarize_run(
    rounds: pl.DataFrame,
    ledger: pl.DataFrame,
    clients: pl.DataFrame,
    *,
    budgets_gib: Sequence[float] = (),
    upload_caps_gib: Sequence[float] = (),
    targets: Sequence[float] = (),
    link: LinkModel = DEFAULT_LINK,
    server_s: pl.Series | None = None,
    target_metric: str = ACCURACY,
    upload_cap_axis: CapAxis = "up_down",
    time_budgets_h: Sequence[float] = (),
    last_k: int = LAST_K,
) -> dict[str, Any]:
    """Summarise one run as a nested, JSON-serialisable dict (the evaluate stage's
    ``summary.json``; its headline numbers are the run's DVC metrics).

    Keys: ``final`` (accuracies and loss: the mean of the last ``last_k`` evaluations; sparsity
    and coverage: the last measured value; total GiB up / down / both),
    ``best`` (best global and local accuracy and their rounds), ``at_budget`` (best accuracy
    within each cumulative GiB budget, up + down), ``at_upload_cap`` (best accuracy within each
    upload cap on ``upload_cap_axis``, FedDST's tables), ``to_target`` (round, GiB, bytes and
    time-to-accuracy ``tta_s`` at which the accuracy first reaches each target; nulls if never)
    and ``time``
    (mean round time, LTTR ``client_s_mean``, total measured seconds).

    A run with simulated time (a ``system`` section: ``time/sim_elapsed_s`` in ``rounds``) also
    gets ``sim`` (simulated hours, mean simulated round, clients per round), ``at_time_budget``
    (best accuracy within each simulated-time budget, hours) and, per target, ``sim_h`` (simulated
    hours to reach it), see :mod:`.sim_time`; a run without has none of these keys. ``tta_s``
    stays the post-hoc model: one uniform ``link`` for every client, no deadline, no
    availability, compute = the measured training time of this machine.

    Args:
        rounds: one row per round (``round`` then metric columns, null when not measured).
        ledger: one row per message.
        clients: one row per (round, participating client) with ``train_s``.
        budgets_gib: communication budgets in GiB (cumulative, up + down).
        upload_caps_gib: upload caps in GiB (cumulative traffic of all clients on
            ``upload_cap_axis``; see :func:`.caps.best_within_upload_cap`).
        targets: accuracy targets in [0, 1].
        link: bandwidths for time-to-accuracy.
        server_s: server seconds per round in round order, instead of the estimate
            ``time/round_s - sum(train_s)``.
        target_metric: the accuracy column budgets, caps and targets refer to (e.g.
            ``"topk/accuracy"`` for next-word prediction).
        upload_cap_axis: what the upload caps count: ``up_down`` (upload + download, the
            reading that reproduces FedDST's Table 1) or ``up`` (upload only).
        time_budgets_h: simulated-time budgets in hours (read only when the run has simulated
            time).
        last_k: how many of the last evaluations a final accuracy averages (1: the last).

    Returns:
        The summary; missing values are ``None``.
    """
    table = run_table(rounds, ledger, clients, link=link, server_s=server_s)
    summary = {
        "final": _final(table, last_k),
        "best": _best(table),
        "at_budget": {
            json_key(b): best_within_budget(table, target_metric, b) for b in budgets_gib
        },
        "at_upload_cap": {
            json_key(c): best_within_upload_cap(table, target_metric, c, upload_cap_axis)
            for c in upload_caps_gib
        },
        "to_target": {json_key(t): _to_target(table, target_metric, t) for t in targets},
        "time": _time(rounds, clients),
    }
    sim = sim_time_summary(
        rounds, time_budgets_h=time_budgets_h, targets=targets, target_metric=target_metric
    )
    return merge_sim_time(summary, sim)
