"""Run summaries for DVC metrics: final, best, accuracy at budgets and upload caps, cost to reach
a target.

Inputs are the three tables a run writes (``rounds``, ``ledger``, ``clients``; schemas in
``simulation/loop.py``). Communication always comes from the ledger, the measured source: a
message costs ``payload_bits + index_bits + meta_bits``; bytes are bits / 8 and GiB are bytes /
2**30. Only when the ledger has no rows do the ``comm/*_bytes`` columns of ``rounds`` stand in.

Time-to-accuracy follows the FedBIAD paper: the sum, over rounds up to the first round whose
accuracy reaches the target, of the slowest client's training time, the largest downlink and
uplink messages sent over a :class:`LinkModel`, and the server's own time.

Everything here is pure polars / python and the outputs are JSON-serialisable (NaN -> null).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from fedcomm.comm.bits import GIB
from fedcomm.evaluation.caps import CapAxis, best_within_cap
from fedcomm.evaluation.sim_time import merge_sim_time, sim_time_summary

ACCURACY = "global/accuracy"
_FINAL_METRICS = (
    "global/accuracy",
    "global/loss",
    "local/accuracy",
    "local/accuracy_weighted",
    "local/coverage",
    "model/sparsity",
)
_MESSAGE_BITS = pl.col("payload_bits") + pl.col("index_bits") + pl.col("meta_bits")


@dataclass(frozen=True)
class LinkModel:
    """Per-client link bandwidths used for time-to-accuracy (FedBIAD's setting).

    Attributes:
        down_mbps: server -> client bandwidth in Mbit/s (1e6 bit/s).
        up_mbps: client -> server bandwidth in Mbit/s.
    """

    down_mbps: float = 110.6
    up_mbps: float = 14.0


def cumulative_bytes(ledger: pl.DataFrame) -> pl.DataFrame:
    """Bytes per round and cumulatively, by direction, from the message ledger.

    Args:
        ledger: one row per message (``round, direction, payload_bits, index_bits, meta_bits``).

    Returns:
        One row per round present in the ledger, sorted: ``round`` (Int32), ``up_bytes``,
        ``down_bytes``, ``cum_up_bytes``, ``cum_down_bytes``, ``cum_bytes`` (Float64).
    """
    per_round = (
        ledger.group_by("round")
        .agg(
            _MESSAGE_BITS.filter(pl.col("direction") == "up").sum().alias("up_bits"),
            _MESSAGE_BITS.filter(pl.col("direction") == "down").sum().alias("down_bits"),
        )
        .sort("round")
    )
    return _with_cumulative(
        per_round.select(
            pl.col("round").cast(pl.Int32),
            (pl.col("up_bits") / 8).alias("up_bytes"),
            (pl.col("down_bits") / 8).alias("down_bytes"),
        )
    )


def _with_cumulative(per_round: pl.DataFrame) -> pl.DataFrame:
    """Add ``cum_up_bytes``, ``cum_down_bytes`` and ``cum_bytes`` to sorted per-round bytes."""
    return per_round.with_columns(
        pl.col("up_bytes").cum_sum().alias("cum_up_bytes"),
        pl.col("down_bytes").cum_sum().alias("cum_down_bytes"),
    ).with_columns((pl.col("cum_up_bytes") + pl.col("cum_down_bytes")).alias("cum_bytes"))


def _bytes_from_rounds(rounds: pl.DataFrame) -> pl.DataFrame:
    """Per-round bytes from the ``comm/up_bytes`` / ``comm/down_bytes`` columns of ``rounds``."""
    cols = {"comm/up_bytes": "up_bytes", "comm/down_bytes": "down_bytes"}
    present = [pl.col(c).fill_null(0.0).alias(a) for c, a in cols.items() if c in rounds.columns]
    missing = [pl.lit(0.0).alias(a) for c, a in cols.items() if c not in rounds.columns]
    per_round = rounds.select(pl.col("round").cast(pl.Int32), *present, *missing).sort("round")
    return _with_cumulative(per_round.cast({"up_bytes": pl.Float64, "down_bytes": pl.Float64}))


def cumulative_at_rounds(round_ids: pl.Series, per_round: pl.DataFrame) -> pl.DataFrame:
    """Cumulative bytes as of each round in ``round_ids`` (rounds without messages carry over).

    Args:
        round_ids: the rounds to report, any order.
        per_round: output of :func:`cumulative_bytes`.

    Returns:
        ``round`` (sorted) with ``cum_up_bytes``, ``cum_down_bytes``, ``cum_bytes`` and
        ``cum_gib``; zero before the first message.
    """
    cum = per_round.select("round", "cum_up_bytes", "cum_down_bytes", "cum_bytes")
    frame = pl.DataFrame({"round": round_ids.cast(pl.Int32)}).sort("round")
    joined = frame.join_asof(cum, on="round", strategy="backward")
    return joined.with_columns(pl.exclude("round").fill_null(0.0)).with_columns(
        (pl.col("cum_bytes") / GIB).alias("cum_gib")
    )


def max_client_bits(ledger: pl.DataFrame) -> pl.DataFrame:
    """Per round, the largest total a single client sent and received.

    Messages of one client, round and direction are summed before the maximum is taken.

    Args:
        ledger: one row per message.

    Returns:
        ``round`` (Int32, sorted), ``down_max_bits``, ``up_max_bits`` (Int64, 0 if none).
    """
    per_client = ledger.group_by("round", "client_id", "direction").agg(
        _MESSAGE_BITS.sum().alias("bits")
    )
    by_dir = [
        pl.col("bits").filter(pl.col("direction") == d).max().alias(f"{d}_max_bits")
        for d in ("down", "up")
    ]
    return (
        per_client.group_by("round")
        .agg(*by_dir)
        .select(pl.col("round").cast(pl.Int32), pl.exclude("round").fill_null(0).cast(pl.Int64))
        .sort("round")
    )


def server_seconds(rounds: pl.DataFrame, clients: pl.DataFrame) -> pl.DataFrame:
    """Server time per round: ``time/round_s`` minus the round's summed client ``train_s``.

    Floored at 0 (clients may train in parallel); a missing round time counts as 0.

    Args:
        rounds: per-round table with ``round`` and ``time/round_s``.
        clients: per (round, client) table with ``round`` and ``train_s``.

    Returns:
        ``round`` (Int32, sorted) and ``server_s``.
    """
    trained = clients.group_by("round").agg(pl.col("train_s").sum().alias("_train"))
    has_time = "time/round_s" in rounds.columns
    round_s = pl.col("time/round_s") if has_time else pl.lit(None, dtype=pl.Float64)
    return (
        rounds.select(pl.col("round").cast(pl.Int32), round_s.alias("time/round_s"))
        .join(trained.with_columns(pl.col("round").cast(pl.Int32)), on="round", how="left")
        .select(
            "round",
            (pl.col("time/round_s").fill_null(0.0) - pl.col("_train").fill_null(0.0))
            .clip(lower_bound=0.0)
            .alias("server_s"),
        )
        .sort("round")
    )


def round_seconds(
    rounds: pl.DataFrame,
    ledger: pl.DataFrame,
    clients: pl.DataFrame,
    *,
    link: LinkModel = LinkModel(),
    server_s: pl.Series | None = None,
) -> pl.DataFrame:
    """Modelled duration of each round under ``link`` (the summand of time-to-accuracy).

    ``max_k train_s + max_k down_bits / (down_mbps·1e6) + max_k up_bits / (up_mbps·1e6) + server``.

    Args:
        rounds: per-round table (``round``, ``time/round_s``).
        ledger: one row per message.
        clients: per (round, client) table with ``train_s``.
        link: bandwidths.
        server_s: server seconds per round in ``round`` order, replacing the measured estimate
            of :func:`server_seconds`.

    Returns:
        ``round`` (Int32, sorted) and ``round_s`` (seconds).
    """
    frame = server_seconds(rounds, clients)
    if server_s is not None:
        if len(server_s) != frame.height:
            raise ValueError(f"server_s has {len(server_s)} values for {frame.height} rounds")
        frame = frame.with_columns(pl.Series("server_s", server_s, dtype=pl.Float64))
    slowest = clients.group_by("round").agg(pl.col("train_s").max().alias("train_max_s"))
    frame = frame.join(
        slowest.with_columns(pl.col("round").cast(pl.Int32)), on="round", how="left"
    ).join(max_client_bits(ledger), on="round", how="left")
    total = (
        pl.col("train_max_s").fill_null(0.0)
        + pl.col("down_max_bits").fill_null(0) / (link.down_mbps * 1e6)
        + pl.col("up_max_bits").fill_null(0) / (link.up_mbps * 1e6)
        + pl.col("server_s")
    )
    return frame.select("round", total.alias("round_s")).sort("round")


def upload_ratios(ledger: pl.DataFrame, dense_model_bits: int) -> pl.DataFrame:
    """Per training round, the dense model's size times the round's uplink messages over what
    they sent.

    ``up_ratio = n_up · dense_model_bits / Σ (payload + index + meta bits)`` over the round's
    uplink messages (all clients); 5 means clients uploaded 5x less than dense FedAvg would
    (FedDST's ~5x at sparsity 0.8, FedBIAD's 1/(1 − p)). Round 0 (a warm start before training,
    e.g. PruneFL's phase one) is left out, and so are rounds that sent nothing up.

    Args:
        ledger: one row per message (``round, direction, *_bits``).
        dense_model_bits: one dense fp32 upload of the whole model (``32·N``).

    Returns:
        ``round`` (Int32, sorted), ``up_bits``, ``up_dense_bits`` (Int64) and ``up_ratio``.
    """
    up = ledger.filter((pl.col("direction") == "up") & (pl.col("round") > 0))
    return (
        up.group_by("round")
        .agg(
            _MESSAGE_BITS.sum().cast(pl.Int64).alias("up_bits"),
            (pl.len() * dense_model_bits).cast(pl.Int64).alias("up_dense_bits"),
        )
        .filter(pl.col("up_bits") > 0)
        .select(
            pl.col("round").cast(pl.Int32),
            "up_bits",
            "up_dense_bits",
            (pl.col("up_dense_bits") / pl.col("up_bits")).alias("up_ratio"),
        )
        .sort("round")
    )


def _float(value: Any) -> float | None:
    """A JSON-safe float: ``None`` for null and NaN."""
    if value is None:
        return None
    out = float(value)
    return None if math.isnan(out) else out


def last_value(frame: pl.DataFrame, column: str) -> float | None:
    """The value of ``column`` in the last row (by round) where it is non-null and not NaN."""
    if column not in frame.columns:
        return None
    values = frame.sort("round")[column].fill_nan(None).drop_nulls()
    return _float(values[-1]) if len(values) else None


def best_value(frame: pl.DataFrame, column: str) -> tuple[float | None, int | None]:
    """The maximum of ``column`` and the first round reaching it (``(None, None)`` if none)."""
    if column not in frame.columns:
        return None, None
    valid = frame.select("round", pl.col(column).fill_nan(None)).drop_nulls().sort("round")
    if valid.is_empty():
        return None, None
    row = valid.row(int(valid[column].arg_max() or 0), named=True)
    return _float(row[column]), int(row["round"])


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
    return _float(values.max()) if len(values) else None


def best_within_budget(frame: pl.DataFrame, column: str, budget_gib: float) -> float | None:
    """The best ``column`` over rounds with ``cum_gib <= budget_gib`` (``None`` if none)."""
    return _best_where(frame, column, pl.col("cum_gib") <= budget_gib)


def best_within_upload_cap(
    frame: pl.DataFrame, column: str, cap_gib: float, axis: CapAxis = "up_down"
) -> float | None:
    """The best ``column`` over rounds whose cumulative traffic on ``axis`` is at most ``cap_gib``.

    FedDST's "upload cap" (Bibikar et al., AAAI 2022, Tables 1-3): the accuracy a run reaches
    before all clients together have moved ``cap_gib`` GiB. ``axis`` says what counts:
    ``up_down`` (upload + download, ``cum_bytes``; the reading that reproduces the paper's
    MNIST FedAvgM row, see :mod:`.caps`) or ``up`` (upload only, ``cum_up_bytes``). We report
    the best evaluation within the cap, not the last one (specs/feddst-progfed.md §1(c)); the
    two agree on rising curves.

    Args:
        frame: a :func:`run_table` (``cum_up_bytes``, ``cum_bytes`` and ``column``).
        column: the accuracy column.
        cap_gib: the cap, in GiB (2**30 bytes).
        axis: what the cap counts (``evaluate.upload_cap_axis``).

    Returns:
        The best value, or ``None`` when no evaluation falls within the cap.
    """
    return best_within_cap(frame, column, cap_gib, axis)


def _key(x: float) -> str:
    """A compact JSON key for a budget or target: ``0.5`` -> ``"0.5"``, ``1.0`` -> ``"1"``."""
    return f"{x:g}"


def _to_target(table: pl.DataFrame, column: str, target: float) -> dict[str, float | int | None]:
    """Round, GiB, bytes and modelled seconds until ``column`` first reaches ``target``."""
    r = first_round_reaching(table, column, target)
    if r is None:
        return {"round": None, "gib": None, "bytes": None, "tta_s": None}
    upto = table.filter(pl.col("round") <= r)
    return {
        "round": r,
        "gib": _float(upto["cum_gib"][-1]),
        "bytes": _float(upto["cum_bytes"][-1]),
        "tta_s": _float(upto["round_s"].sum()),
    }


def _final(table: pl.DataFrame) -> dict[str, float | None]:
    """Last non-null value of each metric, plus total communication (GiB) from the ledger."""
    out = {m: last_value(table, m) for m in _FINAL_METRICS}
    if "topk/accuracy" in table.columns:
        out["topk/accuracy"] = last_value(table, "topk/accuracy")
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
        "round_s_mean": _float(round_s.mean()),
        "client_s_mean": _float(client_s.mean()),
        "total_s": float(round_s.sum()),
    }


def run_table(
    rounds: pl.DataFrame,
    ledger: pl.DataFrame,
    clients: pl.DataFrame,
    *,
    link: LinkModel = LinkModel(),
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
    per_round = cumulative_bytes(ledger) if ledger.height else _bytes_from_rounds(rounds)
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
    link: LinkModel = LinkModel(),
    server_s: pl.Series | None = None,
    target_metric: str = ACCURACY,
    upload_cap_axis: CapAxis = "up_down",
    time_budgets_h: Sequence[float] = (),
) -> dict[str, Any]:
    """Summarise one run as a nested, JSON-serialisable dict (the run's DVC metrics).

    Keys: ``final`` (last measured value of each metric and total GiB up / down / both),
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
            ``upload_cap_axis``; see :func:`best_within_upload_cap`).
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

    Returns:
        The summary; missing values are ``None``.
    """
    table = run_table(rounds, ledger, clients, link=link, server_s=server_s)
    summary = {
        "final": _final(table),
        "best": _best(table),
        "at_budget": {_key(b): best_within_budget(table, target_metric, b) for b in budgets_gib},
        "at_upload_cap": {
            _key(c): best_within_upload_cap(table, target_metric, c, upload_cap_axis)
            for c in upload_caps_gib
        },
        "to_target": {_key(t): _to_target(table, target_metric, t) for t in targets},
        "time": _time(rounds, clients),
    }
    sim = sim_time_summary(
        rounds, time_budgets_h=time_budgets_h, targets=targets, target_metric=target_metric
    )
    return merge_sim_time(summary, sim)


def _is_number(value: Any) -> bool:
    """True for ints and finite-or-infinite floats that are not NaN and not bools."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not math.isnan(value)


def _mean_se(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean and standard error (``stdev(ddof=1) / sqrt(n)``; 0 for one value)."""
    n = len(values)
    if n == 0:
        return {"mean": None, "se": None, "n": 0}
    se = statistics.stdev(values) / math.sqrt(n) if n > 1 else 0.0
    return {"mean": statistics.fmean(values), "se": se, "n": n}


def _aggregate(nodes: Sequence[Any]) -> Any:
    """Aggregate one position of several summaries: recurse into dicts, reduce leaves."""
    dicts = [node for node in nodes if isinstance(node, Mapping)]
    if dicts:
        keys = list(dict.fromkeys(k for d in dicts for k in d))
        return {k: _aggregate([d.get(k) for d in dicts]) for k in keys}
    return _mean_se([float(v) for v in nodes if _is_number(v)])


def aggregate_seeds(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and standard error over seeds of every numeric leaf of :func:`summarize_run` output.

    Each leaf becomes ``{"mean", "se", "n"}``: ``n`` counts the seeds where it is a number
    (nulls, e.g. a target one seed never reached, are left out), ``se = stdev / sqrt(n)``
    with ``ddof=1``, and 0 when ``n == 1``.

    Args:
        summaries: one summary per seed.

    Returns:
        The same nesting with aggregated leaves.
    """
    out = _aggregate(list(summaries))
    return out if isinstance(out, dict) else {}
