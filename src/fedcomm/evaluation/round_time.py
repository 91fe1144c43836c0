"""Modelled round time (the FedBIAD paper's time-to-accuracy): each round lasts its slowest
client's training, its largest downlink and uplink messages sent over a :class:`LinkModel`, and
the server's own time. Summed over the rounds up to a target, this is ``tta_s``.

This is a post-hoc model of a run without simulated time: one uniform link for every client, no
deadline, no availability, compute = the training time measured on this machine. A run with a
``system`` section has its simulated clock instead (:mod:`.sim_time`).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from fedcomm.evaluation.traffic import max_client_bits


@dataclass(frozen=True)
class LinkModel:
    """Per-client link bandwidths used for time-to-accuracy (FedBIAD's setting).

    Attributes:
        down_mbps: server -> client bandwidth in Mbit/s (1e6 bit/s).
        up_mbps: client -> server bandwidth in Mbit/s.
    """

    down_mbps: float = 110.6
    up_mbps: float = 14.0


DEFAULT_LINK = LinkModel()  # FedBIAD's 110.6 Mbit/s down, 14 Mbit/s up (``evaluate.link``)


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
