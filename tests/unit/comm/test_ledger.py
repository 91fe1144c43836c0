"""The communication ledger: fixed schema, per-round sums, truncation and atomic parquet writes."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch

from fedcomm.atomic import write_parquet
from fedcomm.comm import bits
from fedcomm.comm.codecs import encode_dense, encode_sparse
from fedcomm.comm.ledger import SCHEMA, Ledger, per_round
from fedcomm.comm.payload import Meta, Payload

COLUMNS = [
    "round",
    "client_id",
    "direction",
    "payload_bits",
    "index_bits",
    "meta_bits",
    "dense_bits",
    "status",
    "encoded_bits",
    "version",
]


def _dense(numel: int) -> Payload:
    return encode_dense({"w": torch.zeros(numel)})  # numel · 32 bits


def _example() -> Ledger:
    """Two rounds, two clients.

    round 1: down 2 × 8 values (256 bits each); up client 0 sparse, client 1 dense 8 values.
    round 2: down 1 × 8 values; up client 1: 4 values + one 32-bit meta scalar.
    """
    ledger = Ledger()
    ledger.record(1, 0, "down", _dense(8))  # 256
    ledger.record(1, 1, "down", _dense(8))  # 256
    sparse = torch.zeros(8)
    sparse[2] = 1.0  # 1 value (32) + min(bitmap 8, coo 1 · 3) = 3 index bits; dense ref 256
    ledger.record(1, 0, "up", encode_sparse({"w": sparse}))
    ledger.record(1, 1, "up", _dense(8))  # 256
    ledger.record(2, 1, "down", _dense(8))  # 256
    up = Payload({**encode_dense({"w": torch.zeros(4)}), "scale": Meta(torch.tensor(0.5))})
    ledger.record(2, 1, "up", up)  # 128 + 32 meta; dense ref 128 + 32
    return ledger


def test_record_returns_total_bits() -> None:
    ledger = Ledger()
    assert ledger.record(3, 7, "up", _dense(10)) == 320
    assert ledger.rows == [(3, 7, "up", 320, 0, 0, 320, "sent", 320, 2)]


def test_a_message_not_sent_counts_no_bits_and_keeps_its_encoding() -> None:
    ledger = Ledger()
    assert ledger.record(1, 2, "up", _dense(10), status="not_sent") == 0
    assert ledger.record(1, 3, "up", _dense(10), status="partial", sent_bits=100) == 100
    assert ledger.record(1, 4, "up", _dense(10), status="partial", sent_bits=999) == 320
    assert ledger.rows == [
        (1, 2, "up", 0, 0, 0, 320, "not_sent", 320, 0),
        (1, 3, "up", 100, 0, 0, 320, "partial", 320, 0),
        (1, 4, "up", 320, 0, 0, 320, "partial", 320, 0),
    ]
    assert per_round(ledger.frame())["up_bytes"].to_list() == [(100 + 320) / 8]


def test_schema_and_dtypes() -> None:
    frame = _example().frame()
    assert frame.columns == COLUMNS
    assert dict(frame.schema) == SCHEMA
    assert frame.schema["round"] == pl.Int32
    assert frame.schema["direction"] == pl.String
    assert frame.schema["payload_bits"] == pl.Int64
    assert frame.height == 6
    assert frame.row(2) == (1, 0, "up", 32, 3, 0, 256, "sent", 35, 0)
    assert frame.row(5) == (2, 1, "up", 128, 0, 32, 160, "sent", 160, 1)


def test_version_is_the_model_the_client_trained_on() -> None:
    """issue 45: a round-``r`` message carries version ``r - 1`` unless told (an asynchronous
    server's stale uplink); round 0's (warm start) carry the initial model, 0."""
    ledger = Ledger()
    ledger.record(0, 1, "up", _dense(1))
    ledger.record(4, 1, "down", _dense(1))
    ledger.record(4, 2, "up", _dense(1), version=1)
    assert [r[-1] for r in ledger.rows] == [0, 3, 1]
    assert ledger.frame()["version"].to_list() == [0, 3, 1]


def test_empty_ledger_has_the_schema() -> None:
    frame = Ledger().frame()
    assert frame.height == 0
    assert dict(frame.schema) == SCHEMA


def test_per_round_by_hand() -> None:
    summary = per_round(_example().frame())
    assert summary["round"].to_list() == [1, 2]
    # round 1: up (32 + 3) + 256 = 291 bits = 36.375 B; down 512 bits = 64 B
    # round 2: up 128 + 32 = 160 bits = 20 B;            down 256 bits = 32 B
    assert summary["up_bytes"].to_list() == [36.375, 20.0]
    assert summary["down_bytes"].to_list() == [64.0, 32.0]
    # dense reference: round 1: 4 · 256 bits = 128 B; round 2: 256 + 160 bits = 52 B
    assert summary["dense_bytes"].to_list() == [128.0, 52.0]
    # cumulative: 100.375, 100.375 + 52 = 152.375 bytes
    assert summary["cum_bytes"].to_list() == [100.375, 152.375]
    assert summary["cum_gib"].to_list() == pytest.approx([100.375 / 2**30, 152.375 / 2**30])


def test_per_round_sorts_rounds_and_fills_missing_direction() -> None:
    ledger = Ledger()
    ledger.record(5, 0, "down", _dense(2))  # 64 bits, no upload in round 5
    ledger.record(2, 0, "up", _dense(1))  # 32 bits, no download in round 2
    summary = per_round(ledger.frame())
    assert summary["round"].to_list() == [2, 5]
    assert summary["up_bytes"].to_list() == [4.0, 0.0]
    assert summary["down_bytes"].to_list() == [0.0, 8.0]
    assert summary["cum_bytes"].to_list() == [4.0, 12.0]


def test_per_round_cum_gib_matches_bits() -> None:
    ledger = _example()
    total_bits = sum(r[3] + r[4] + r[5] for r in ledger.rows)
    assert per_round(ledger.frame())["cum_gib"][-1] == pytest.approx(bits.to_gib(total_bits))


def test_totals_by_name_sum_the_link_bits_of_the_rows() -> None:
    ledger = _example()
    ledger.record(3, 0, "up", _dense(4), status="partial", sent_bits=50)  # 50 of 128 bits sent
    ledger.record(3, 1, "up", _dense(4), status="not_sent")  # none sent
    link = [r[3] + r[4] + r[5] for r in ledger.rows]
    up = sum(n for n, r in zip(link, ledger.rows, strict=True) if r[2] == "up")
    assert ledger.bits() == sum(link)
    assert ledger.up_bits() == up and ledger.down_bits() == sum(link) - up
    assert ledger.bits("up", "partial") == 50
    assert ledger.bits(status="not_sent") == 0
    assert ledger.bits("up", "sent") == up - 50
    # rebuilt from its rows (a resumed run), the totals are the same
    again = Ledger(list(ledger.rows))
    assert (again.bits(), again.up_bits(), again.bits("up", "partial")) == (sum(link), up, 50)


def test_write_round_trips_and_leaves_no_temp_file(tmp_path: Path) -> None:
    ledger = _example()
    path = tmp_path / "sub" / "ledger.parquet"
    ledger.write(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["ledger.parquet"]
    back = pl.read_parquet(path)
    assert back.equals(ledger.frame())
    assert dict(back.schema) == SCHEMA

    shorter = Ledger(ledger.rows[:4])
    shorter.write(path)  # replaces the old file
    assert sorted(p.name for p in path.parent.iterdir()) == ["ledger.parquet"]
    assert pl.read_parquet(path).height == 4


def test_failed_write_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "ledger.parquet"
    write_parquet(path, _example().frame())
    before = path.read_bytes()

    def broken(self: pl.DataFrame, file: Path, *args: object, **kwargs: object) -> None:
        Path(file).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(pl.DataFrame, "write_parquet", broken)
    with pytest.raises(OSError, match="disk full"):
        write_parquet(path, Ledger().frame())
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.parquet"]  # no temp left behind
