"""Communication from the message ledger: bytes per round and cumulatively, the largest client
message of each round, the upload ratio against dense FedAvg.

The ledger is the measured source: one row per message, ``round, client_id, direction,
payload_bits, index_bits, meta_bits, ...``. A message costs ``payload_bits + index_bits +
meta_bits``; bytes are bits / 8 and GiB are bytes / 2**30. Only a run without ledger rows falls
back on the ``comm/*_bytes`` columns of its rounds table (:func:`bytes_from_rounds`).
"""

from __future__ import annotations

import polars as pl

from fedcomm.comm.bits import GIB

MESSAGE_BITS = pl.col("payload_bits") + pl.col("index_bits") + pl.col("meta_bits")


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
            MESSAGE_BITS.filter(pl.col("direction") == "up").sum().alias("up_bits"),
            MESSAGE_BITS.filter(pl.col("direction") == "down").sum().alias("down_bits"),
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


def bytes_from_rounds(rounds: pl.DataFrame) -> pl.DataFrame:
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
        MESSAGE_BITS.sum().alias("bits")
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


def upload_ratios(ledger: pl.DataFrame, dense_model_bits: int) -> pl.DataFrame:
    """Per training round, the dense model's size times the round's uplink messages over what
    they sent.

    ``up_ratio = Σ dense_model_bits · sent / encoded / Σ sent`` over the round's uplink messages
    (``sent``: payload + index + meta bits over the link; ``encoded``: the whole encoding): each
    message stands for the dense model in proportion to the part of its encoding it sent (all of
    it for an uplink sent whole, none for one not sent, a fraction for one cut mid-way under
    ``cut_uplink: partial``), so dense FedAvg's ratio is 1; 5 means clients uploaded 5x less than
    dense FedAvg would
    (FedDST's ~5x at sparsity 0.8, FedBIAD's 1/(1 − p)). Round 0 (a warm start before training,
    e.g. PruneFL's phase one) is left out, and so are rounds that sent nothing up.

    Args:
        ledger: one row per message (``round, direction, *_bits``).
        dense_model_bits: one dense fp32 upload of the whole model (``32·N``).

    Returns:
        ``round`` (Int32, sorted), ``up_bits``, ``up_dense_bits`` (Int64) and ``up_ratio``.
    """
    up = ledger.filter((pl.col("direction") == "up") & (pl.col("round") > 0))
    # (a ledger from before cut uplinks has no encoded_bits: every message was sent whole)
    encoded = pl.col("encoded_bits") if "encoded_bits" in ledger.columns else MESSAGE_BITS
    return (
        up.group_by("round")
        .agg(
            MESSAGE_BITS.sum().cast(pl.Int64).alias("up_bits"),
            (dense_model_bits * MESSAGE_BITS / encoded.clip(lower_bound=1))
            .sum()
            .round()
            .cast(pl.Int64)
            .alias("up_dense_bits"),
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
