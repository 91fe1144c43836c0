"""The communication ledger: one row per message, as a polars table.

Schema: ``round, client_id, direction, payload_bits, index_bits, meta_bits, dense_bits, status,
encoded_bits, version``. ``dense_bits`` is the size the same content would have had sent densely
(the reference for compression ratios). The bit columns count what went over the link: ``status`` is
``sent`` for every message unless a round under a ``system`` section (simulated time) dropped a
client: its uplink is then ``not_sent`` (0 bits) or ``partial`` (the bits it had sent when the
round closed, all counted as payload), and ``encoded_bits`` keeps what its codec encoded either
way. ``version`` is the global model version the message's client trained on: the number of
server steps before its downlink (``round - 1`` in synchronous rounds; under asynchronous
aggregation, :mod:`fedcomm.simulation.asynchronous`, an uplink's may be older than its round's).
Totals are summarised per round and cumulatively in bytes and GiB.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import polars as pl

from fedcomm import atomic
from fedcomm.comm import bits
from fedcomm.comm.payload import Payload

Direction = Literal["down", "up"]
Status = Literal["sent", "not_sent", "partial"]

SCHEMA: dict[str, pl.DataType] = {
    "round": pl.Int32(),
    "client_id": pl.Int32(),
    "direction": pl.String(),
    "payload_bits": pl.Int64(),
    "index_bits": pl.Int64(),
    "meta_bits": pl.Int64(),
    "dense_bits": pl.Int64(),
    "status": pl.String(),
    "encoded_bits": pl.Int64(),
    "version": pl.Int32(),
}
Row = tuple[int, int, str, int, int, int, int, str, int, int]  # SCHEMA's columns, in order
# what a reader needs (a ledger written before model versions has no ``version``)
REQUIRED = tuple(c for c in SCHEMA if c != "version")


@dataclass
class Ledger:
    """Append-only message log. Rows are plain tuples (in :data:`SCHEMA`'s order) until
    :meth:`frame` is asked for; the bits that went over the link are kept as totals by
    direction and status, so :meth:`bits` (and :meth:`up_bits`, :meth:`down_bits`) answer at
    once."""

    rows: list[Row] = field(default_factory=list)
    _link: Counter[tuple[str, str]] = field(init=False, repr=False)  # (direction, status) -> bits
    _downlinks: int = field(init=False, repr=False, default=0)  # rounds >= 1: clients sampled

    def __post_init__(self) -> None:
        self._link = Counter()
        for row in self.rows:
            self._count(row)

    def downlinks(self) -> int:
        """Downlink messages of rounds 1 on: every client sampled in every round so far (each
        gets the round's downlink, over-selected ones included)."""
        return self._downlinks

    def record(
        self,
        round_: int,
        client_id: int,
        direction: Direction,
        payload: Payload,
        *,
        status: Status = "sent",
        sent_bits: int = 0,
        version: int | None = None,
    ) -> int:
        """Add one message; returns the bits that went over the link (all of them when
        ``sent``; ``sent_bits`` of them when ``partial``; none when ``not_sent``). ``version``:
        the model version its client trained on (None: ``round_ - 1``, round 0's: 0)."""
        n = payload.nbits()
        bits_ = (n.payload, n.index, n.meta)
        if status == "not_sent":
            bits_ = (0, 0, 0)
        elif status == "partial":
            bits_ = (min(sent_bits, n.total), 0, 0)
        v = max(round_ - 1, 0) if version is None else version
        row: Row = (
            round_, client_id, direction, *bits_, payload.dense_bits(), status, n.total, v
        )  # fmt: skip
        self.rows.append(row)
        return self._count(row)

    def bits(self, direction: Direction | None = None, status: Status | None = None) -> int:
        """The bits that went over the link (payload + index + meta) in ``direction`` with
        ``status`` (None: any)."""
        return sum(
            n for (d, s), n in self._link.items() if direction in (None, d) and status in (None, s)
        )

    def up_bits(self) -> int:
        """The uplink's bits so far (a cut uplink counts what it had sent)."""
        return self.bits("up")

    def down_bits(self) -> int:
        """The downlink's bits so far."""
        return self.bits("down")

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.rows, schema=SCHEMA, orient="row")

    def write(self, path: Path) -> None:
        atomic.write_parquet(path, self.frame())

    def _count(self, row: Row) -> int:
        round_, _client, direction, payload, index, meta, _dense, status, _encoded, _v = row
        link = payload + index + meta
        self._link[(direction, status)] += link
        self._downlinks += direction == "down" and round_ > 0
        return link


def per_round(ledger: pl.DataFrame) -> pl.DataFrame:
    """Bytes per round and direction, with cumulative totals (bytes and GiB)."""
    total = pl.col("payload_bits") + pl.col("index_bits") + pl.col("meta_bits")
    wide = (
        ledger.group_by("round")
        .agg(
            (total.filter(pl.col("direction") == "up").sum() / 8).alias("up_bytes"),
            (total.filter(pl.col("direction") == "down").sum() / 8).alias("down_bytes"),
            (pl.col("dense_bits").sum() / 8).alias("dense_bytes"),
        )
        .sort("round")
    )
    return wide.with_columns(
        (pl.col("up_bytes") + pl.col("down_bytes")).cum_sum().alias("cum_bytes"),
    ).with_columns((pl.col("cum_bytes") / bits.GIB).alias("cum_gib"))
