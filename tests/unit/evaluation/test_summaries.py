"""Golden-value tests of evaluation.summaries on a hand-made 4-round, 2-client run.

Sizes are in MiB so the arithmetic stays readable: 1 MiB = 2**23 bits, 1 GiB = 1024 MiB. The link
model is chosen so that 1 MiB down takes 1 s and 1 MiB up takes 2 s.

Ledger (MiB, per client):      down           up        round MiB (down + up)  cumulative
    round 1:  c0 1, c1 1          c0 0.5, c1 0.25        2 + 0.75              2.75
    round 2:  c0 1, c1 1          c0 0.25, c1 0.75       2 + 1.0               5.75
    round 3:  c1 1 + 1 (2 msgs)   c1 0.125               2 + 0.125             7.875
    round 4:  (no messages)                                                    7.875
Clients' train_s: r1 c0 3, c1 4; r2 c0 2, c1 5; r3 c1 6.  time/round_s: 10, 12, 9, 5.
Server time = round_s - sum(train_s): 10-7=3, 12-7=5, 9-6=3, 5-0=5.
Modelled round time = max train + max down/1 + max up*2 + server:
    r1: 4 + 1 + 0.5*2 + 3 = 9;  r2: 5 + 1 + 0.75*2 + 5 = 12.5;  r3: 6 + 2 + 0.125*2 + 3 = 11.25;
    r4: 0 + 0 + 0 + 5 = 5.
"""

from __future__ import annotations

import json
import math

import polars as pl
import pytest

from fedcomm.evaluation.round_time import LinkModel, round_seconds, server_seconds
from fedcomm.evaluation.seeds import aggregate_seeds
from fedcomm.evaluation.summaries import summarize_run
from fedcomm.evaluation.traffic import (
    cumulative_at_rounds,
    cumulative_bytes,
    max_client_bits,
    upload_ratios,
)

MIB = 2**23  # bits
GIB_MIB = 1024  # MiB per GiB
LINK = LinkModel(down_mbps=MIB / 1e6, up_mbps=MIB / 2e6)  # 1 MiB: 1 s down, 2 s up


def _msg(round_: int, client: int, direction: str, mib: float) -> tuple[int, ...]:
    """A message of ``mib`` MiB split 80/15/5 over payload / index / meta bits."""
    total = int(mib * MIB)
    payload, index = total * 80 // 100, total * 15 // 100
    return (round_, client, direction, payload, index, total - payload - index, total)


LEDGER = pl.DataFrame(
    [
        _msg(1, 0, "down", 1),
        _msg(1, 1, "down", 1),
        _msg(1, 0, "up", 0.5),
        _msg(1, 1, "up", 0.25),
        _msg(2, 0, "down", 1),
        _msg(2, 1, "down", 1),
        _msg(2, 0, "up", 0.25),
        _msg(2, 1, "up", 0.75),
        _msg(3, 1, "down", 1),
        _msg(3, 1, "down", 1),
        _msg(3, 1, "up", 0.125),
    ],
    schema={
        "round": pl.Int32,
        "client_id": pl.Int32,
        "direction": pl.String,
        "payload_bits": pl.Int64,
        "index_bits": pl.Int64,
        "meta_bits": pl.Int64,
        "dense_bits": pl.Int64,
    },
    orient="row",
)
CLIENTS = pl.DataFrame(
    {
        "round": [1, 1, 2, 2, 3],
        "client_id": [0, 1, 0, 1, 1],
        "num_examples": [10, 20, 10, 20, 20],
        "train_s": [3.0, 4.0, 2.0, 5.0, 6.0],
    },
    schema_overrides={"round": pl.Int32, "client_id": pl.Int32},
)
ROUNDS = pl.DataFrame(
    {
        "round": [1, 2, 3, 4],
        "global/accuracy": [0.5, None, 0.8, 0.7],
        "global/loss": [1.2, None, 0.6, 0.7],
        "local/accuracy": [None, 0.8, 0.75, None],
        "local/accuracy_weighted": [None, 0.82, 0.7, None],
        "local/coverage": [None, 0.5, 1.0, None],
        "model/sparsity": [0.0, 0.3, 0.5, 0.5],
        "time/round_s": [10.0, 12.0, 9.0, 5.0],
    },
    schema_overrides={"round": pl.Int32},
)


def _summary(**kwargs: object) -> dict[str, object]:
    return summarize_run(ROUNDS, LEDGER, CLIENTS, link=LINK, **kwargs)  # type: ignore[arg-type]


def test_cumulative_bytes_per_round() -> None:
    out = cumulative_bytes(LEDGER)
    mib = 2**20  # bytes
    assert out["round"].to_list() == [1, 2, 3]
    assert out["up_bytes"].to_list() == [0.75 * mib, 1.0 * mib, 0.125 * mib]
    assert out["down_bytes"].to_list() == [2 * mib, 2 * mib, 2 * mib]
    assert out["cum_bytes"].to_list() == [2.75 * mib, 5.75 * mib, 7.875 * mib]
    assert out["cum_up_bytes"][-1] == 1.875 * mib


def test_cumulative_at_rounds_carries_over_gaps() -> None:
    out = cumulative_at_rounds(pl.Series([4, 0, 2]), cumulative_bytes(LEDGER))
    assert out["round"].dtype == pl.Int32
    assert out["round"].to_list() == [0, 2, 4]
    assert out["cum_bytes"].to_list() == [0.0, 5.75 * 2**20, 7.875 * 2**20]
    assert out["cum_gib"][-1] == pytest.approx(7.875 / GIB_MIB)


def test_max_client_bits_sums_a_clients_messages_first() -> None:
    out = max_client_bits(LEDGER)
    assert out["down_max_bits"].to_list() == [MIB, MIB, 2 * MIB]  # r3: two 1-MiB messages
    assert out["up_max_bits"].to_list() == [MIB // 2, MIB * 3 // 4, MIB // 8]


def test_server_seconds_floored_at_zero() -> None:
    assert server_seconds(ROUNDS, CLIENTS)["server_s"].to_list() == [3.0, 5.0, 3.0, 5.0]
    fast = ROUNDS.with_columns(pl.lit(1.0).alias("time/round_s"))  # parallel clients
    assert server_seconds(fast, CLIENTS)["server_s"].to_list() == [0.0, 0.0, 0.0, 1.0]


def test_round_seconds_golden() -> None:
    out = round_seconds(ROUNDS, LEDGER, CLIENTS, link=LINK)
    assert out["round_s"].to_list() == pytest.approx([9.0, 12.5, 11.25, 5.0])


def test_round_seconds_default_link_is_fedbiads() -> None:
    r1 = round_seconds(ROUNDS, LEDGER, CLIENTS)["round_s"][0]
    # 4 s training + 1 MiB at 110.6 Mbit/s + 0.5 MiB at 14.0 Mbit/s + 3 s server
    assert r1 == pytest.approx(4 + MIB / 110.6e6 + (MIB / 2) / 14.0e6 + 3)


def test_summary_final_and_best() -> None:
    # final: accuracies and loss the mean of the last evaluate.last_k (5) evaluations, states
    # (coverage, sparsity) the last measured value
    s = _summary()
    assert s["final"] == pytest.approx(
        {
            "global/accuracy": (0.5 + 0.8 + 0.7) / 3,  # rounds 1, 3, 4 (2 not evaluated)
            "global/loss": (1.2 + 0.6 + 0.7) / 3,
            "local/accuracy": (0.8 + 0.75) / 2,
            "local/accuracy_weighted": (0.82 + 0.7) / 2,
            "local/coverage": 1.0,  # round 3, the last measured
            "model/sparsity": 0.5,
            "comm/cum_gib": 7.875 / GIB_MIB,
            "comm/up_gib": 1.875 / GIB_MIB,
            "comm/down_gib": 6.0 / GIB_MIB,
        }
    )
    assert s["best"] == {
        "global/accuracy": 0.8,
        "global/accuracy_round": 3,
        "local/accuracy": 0.8,
        "local/accuracy_round": 2,
    }
    assert s["time"] == pytest.approx(
        {"round_s_mean": 9.0, "client_s_mean": 4.0, "total_s": 36.0}  # 36/4; 20/5
    )


def test_summary_final_with_last_k_1_is_the_last_evaluation() -> None:
    final = _summary(last_k=1)["final"]
    assert final["global/accuracy"] == 0.7 and final["local/accuracy"] == 0.75  # rounds 4, 3
    assert _summary(last_k=2)["final"]["global/accuracy"] == pytest.approx(0.75)  # rounds 3, 4


def test_summary_at_budget() -> None:
    budgets = [2 / GIB_MIB, 4 / GIB_MIB, 6 / GIB_MIB, 8 / GIB_MIB]
    s = _summary(budgets_gib=budgets)
    # <= 2 MiB: no round; <= 4: round 1 (0.5); <= 6: rounds 1-2 (0.5, null); <= 8: all (0.8)
    assert s["at_budget"] == {
        f"{b:g}": v for b, v in zip(budgets, [None, 0.5, 0.5, 0.8], strict=False)
    }


def test_summary_at_upload_cap_counts_uploads_only() -> None:
    caps = [0.5, 0.75, 1.0, 1.8, 1.875]  # MiB of cumulative upload
    s = summarize_run(
        ROUNDS,
        LEDGER,
        CLIENTS,
        upload_caps_gib=[c / GIB_MIB for c in caps],
        budgets_gib=[1.0 / GIB_MIB],
        upload_cap_axis="up",
    )
    # cumulative upload: r1 0.75, r2 1.75, r3 1.875, r4 1.875 MiB; accuracy 0.5, null, 0.8, 0.7
    assert list(s["at_upload_cap"].values()) == [None, 0.5, 0.5, 0.5, 0.8]  # cap is inclusive
    assert list(s["at_upload_cap"]) == [f"{c / GIB_MIB:g}" for c in caps]
    assert s["at_budget"] == {f"{1.0 / GIB_MIB:g}": None}  # up + down passes 1 MiB in round 1
    assert _summary()["at_upload_cap"] == {}
    json.dumps(s, allow_nan=False)


def test_upload_ratios_per_round_dense_model_over_sent() -> None:
    ledger = pl.DataFrame(
        [
            (0, 2, "up", 100, 0, 0, 100),  # warm start: left out
            (1, 0, "up", 60, 30, 10, 500),
            (1, 1, "up", 100, 0, 0, 300),  # round 1: 2 x 400 / 200 = 4
            (1, 0, "down", 10, 0, 0, 9999),  # downlink: left out
            (2, 0, "up", 400, 0, 0, 400),  # round 2: 1
            (3, 1, "up", 0, 0, 0, 0),  # nothing sent: left out
        ],
        schema=LEDGER.schema,
        orient="row",
    )
    out = upload_ratios(ledger, dense_model_bits=400)
    assert out["round"].to_list() == [1, 2]
    assert out["up_bits"].to_list() == [200, 400]
    assert out["up_dense_bits"].to_list() == [800, 400]
    assert out["up_ratio"].to_list() == [4.0, 1.0]
    from fedcomm.stages.evaluate import upload_summary

    summary = upload_summary(ledger, 400)
    assert summary["up_ratio_mean"] == 2.5  # mean over rounds, not 1200 / 600
    assert summary["bytes_per_client_round"] == pytest.approx(700 / 5 / 8)  # all 5 up messages
    down_only = ledger.filter(pl.col("direction") == "down")
    assert upload_summary(down_only, 400)["up_ratio_mean"] is None


def test_summary_to_target_and_tta() -> None:
    s = _summary(targets=[0.5, 0.75, 0.9])
    assert s["to_target"]["0.5"] == pytest.approx(
        {"round": 1, "gib": 2.75 / GIB_MIB, "bytes": 2.75 * 2**20, "tta_s": 9.0}
    )
    # reached at round 3 (0.8): 9 + 12.5 + 11.25
    assert s["to_target"]["0.75"] == pytest.approx(
        {"round": 3, "gib": 7.875 / GIB_MIB, "bytes": 7.875 * 2**20, "tta_s": 32.75}
    )
    assert s["to_target"]["0.9"] == {"round": None, "gib": None, "bytes": None, "tta_s": None}
    json.dumps(s, allow_nan=False)  # valid JSON for DVC


def test_summary_server_time_override() -> None:
    s = _summary(targets=[0.75], server_s=pl.Series([0.0, 0.0, 0.0, 0.0]))
    assert s["to_target"]["0.75"]["tta_s"] == pytest.approx(6 + 7.5 + 8.25)
    with pytest.raises(ValueError, match="server_s"):
        _summary(server_s=pl.Series([0.0]))


def test_summary_empty_ledger_falls_back_to_rounds_bytes() -> None:
    rounds = ROUNDS.with_columns(
        pl.Series("comm/up_bytes", [1.0, 2.0, None, 4.0]),
        pl.Series("comm/down_bytes", [8.0, 8.0, 8.0, 8.0]),
    )
    s = summarize_run(rounds, LEDGER.clear(), CLIENTS)
    assert s["final"]["comm/up_gib"] == pytest.approx(7 / 2**30)
    assert s["final"]["comm/cum_gib"] == pytest.approx(39 / 2**30)


def test_summary_nan_and_missing_columns_become_null() -> None:
    rounds = pl.DataFrame(
        {"round": [1, 2], "global/accuracy": [float("nan"), float("nan")]},
        schema_overrides={"round": pl.Int32},
    )
    s = summarize_run(rounds, LEDGER.clear(), CLIENTS.clear(), targets=[0.1])
    assert s["final"]["global/accuracy"] is None
    assert s["final"]["local/accuracy"] is None
    assert s["best"]["global/accuracy_round"] is None
    assert s["to_target"]["0.1"]["round"] is None
    assert s["time"]["client_s_mean"] is None
    json.dumps(s, allow_nan=False)


def test_aggregate_seeds_mean_and_se() -> None:
    seeds = [
        {"final": {"acc": 0.5, "never": None}, "to_target": {"0.9": {"round": 3}}},
        {"final": {"acc": 0.7, "never": None}, "to_target": {"0.9": {"round": None}}},
        {"final": {"acc": 0.9, "never": None}, "to_target": {"0.9": {"round": 5}}},
    ]
    out = aggregate_seeds(seeds)
    # acc: mean 0.7, sample std 0.2 -> se 0.2 / sqrt(3)
    assert out["final"]["acc"] == pytest.approx({"mean": 0.7, "se": 0.2 / math.sqrt(3), "n": 3})
    assert out["final"]["never"] == {"mean": None, "se": None, "n": 0}
    # round: the seed that never reached the target is left out; std of (3, 5) = sqrt 2
    assert out["to_target"]["0.9"]["round"] == pytest.approx({"mean": 4.0, "se": 1.0, "n": 2})


def test_aggregate_single_seed_has_zero_se() -> None:
    out = aggregate_seeds([_summary()])
    assert out["best"]["global/accuracy"] == {"mean": 0.8, "se": 0.0, "n": 1}
    json.dumps(out, allow_nan=False)


def test_a_runs_headline_and_the_summary_runs_metrics_read_the_same_keys() -> None:
    """``metrics.json`` (one run) and the summarize stage's MLflow metrics (means over seeds)
    take their final numbers from the same keys of a summary's ``final`` section."""
    from fedcomm.evaluation.headline import run_headline
    from fedcomm.stages.summarize import summary_metrics

    final = {
        "global/accuracy": 0.5,
        "topk/accuracy": 0.75,
        "local/accuracy": 0.25,
        "comm/up_gib": 1.0,
        "comm/down_gib": 2.0,
    }
    summary = {
        "final": final,
        "comm": {"cost_vs_dense_e2e": 0.5},
        "to_target": {"0.5": {"gib": 3.0}},
    }
    assert run_headline(summary, metric="topk/accuracy", targets=[0.5]) == {
        "final_acc": 0.75,
        "final_local_acc": 0.25,
        "up_gib": 1.0,
        "down_gib": 2.0,
        "save_x": 2.0,
        "gib_to_0.5": 3.0,
    }
    assert summary_metrics({"a": {"seeds": 2, "final": final}}, "topk/accuracy") == {
        "a/final_acc": 0.75,
        "a/final_local_acc": 0.25,
        "a/up_gib": 1.0,
        "a/down_gib": 2.0,
    }
