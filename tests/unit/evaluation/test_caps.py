"""Upload caps (FedDST's Tables 1-3) on either axis: upload + download (the default, the
reading that reproduces the paper's Table 1) or upload only; from run tables, curves tables,
``summarize_run`` and ``evaluate.upload_cap_axis``.

A hand-made run, sizes in MiB (1 GiB = 1024 MiB): each round uploads 1 MiB and downloads 1 MiB
(dense FedAvgM: down = up), so after round r the upload is r MiB and up + down 2r MiB.
Accuracy by round: 0.2, 0.5, null (not evaluated), 0.9.
"""

from __future__ import annotations

import polars as pl
import pytest

from fedcomm.config import ConfigError, validate_params
from fedcomm.errors import InputError
from fedcomm.evaluation.caps import (
    axis_gib,
    best_within_cap,
    best_within_upload_cap,
    curves_at_caps,
)
from fedcomm.evaluation.summaries import summarize_run
from tests.conftest import tiny_params
from tests.unit.evaluation.test_summaries import LEDGER

MIB_GIB = 1 / 1024  # GiB per MiB
ACC = [0.2, 0.5, None, 0.9]


def _run_table() -> pl.DataFrame:
    r = [1, 2, 3, 4]
    return pl.DataFrame(
        {
            "round": r,
            "cum_up_bytes": [x * 2**20 for x in r],
            "cum_bytes": [2 * x * 2**20 for x in r],
            "global/accuracy": ACC,
        },
        schema_overrides={"cum_up_bytes": pl.Float64, "cum_bytes": pl.Float64},
    )


def _curves() -> pl.DataFrame:
    """Two runs x one seed in the long curves format (``cum_gib`` = up + down in GiB)."""
    t = _run_table()
    a = t.select(
        pl.lit("fedavgm").alias("run"),
        pl.lit(0).alias("seed"),
        "round",
        (pl.col("cum_bytes") / 2**30).alias("cum_gib"),
        "cum_up_bytes",
        pl.col("global/accuracy").alias("global_accuracy"),
    )
    # a 4x cheaper run that is never better: within the same cap it has 4x the rounds
    b = a.with_columns(
        pl.lit("sparse").alias("run"),
        pl.col("cum_gib") / 4,
        pl.col("cum_up_bytes") / 4,
        pl.col("global_accuracy") - 0.1,
    )
    return pl.concat([a, b])


@pytest.mark.parametrize(
    ("cap_mib", "up_down", "up"),
    [
        (0.5, None, None),  # nothing within half a round
        (2.0, 0.2, 0.5),  # up + down: round 1 only; up: rounds 1-2
        (4.0, 0.5, 0.9),  # up + down: rounds 1-2 (round 3 not evaluated); up: every round
        (8.0, 0.9, 0.9),
    ],
)
def test_axes_count_what_they_say(cap_mib: float, up_down: float | None, up: float | None) -> None:
    t = _run_table()
    assert best_within_cap(t, "global/accuracy", cap_mib * MIB_GIB, "up_down") == up_down
    assert best_within_cap(t, "global/accuracy", cap_mib * MIB_GIB, "up") == up
    assert best_within_upload_cap(t, "global/accuracy", cap_mib * MIB_GIB) == up_down  # default


def test_curves_table_and_run_table_agree() -> None:
    t, c = _run_table(), _curves().filter(pl.col("run") == "fedavgm")
    for cap in (1.0, 2.0, 3.0, 4.0, 6.0, 8.0):
        for axis in ("up_down", "up"):
            got = best_within_cap(c, "global_accuracy", cap * MIB_GIB, axis)  # type: ignore[arg-type]
            assert got == best_within_cap(t, "global/accuracy", cap * MIB_GIB, axis)  # type: ignore[arg-type]
    got_gib = t.select(axis_gib(t, "up_down")).to_series().to_list()
    assert got_gib == pytest.approx([2 * MIB_GIB, 4 * MIB_GIB, 6 * MIB_GIB, 8 * MIB_GIB])
    # the columns as the curves CSV of `fedcomm curves` names them (comm_ prefix) read the same
    csv = c.rename({n: f"comm_{n}" for n in ("cum_up_bytes", "cum_gib") if n in c.columns})
    assert csv.columns != c.columns
    for cap in (1.0, 4.0):
        for axis in ("up_down", "up"):
            got = best_within_cap(csv, "global_accuracy", cap * MIB_GIB, axis)  # type: ignore[arg-type]
            assert got == best_within_cap(c, "global_accuracy", cap * MIB_GIB, axis)  # type: ignore[arg-type]


def test_curves_at_caps_one_row_per_run_seed_cap() -> None:
    out = curves_at_caps(_curves(), "global_accuracy", [2 * MIB_GIB, 8 * MIB_GIB])
    assert out.columns == ["run", "seed", "cap_gib", "best", "last_round", "passed"]
    rows = {
        (r["run"], r["cap_gib"]): (r["best"], r["last_round"], r["passed"]) for r in out.to_dicts()
    }
    assert rows[("fedavgm", 2 * MIB_GIB)] == (0.2, 1, True)
    assert rows[("fedavgm", 8 * MIB_GIB)] == (0.9, 4, False)  # the run ends at the cap
    # the 4x cheaper run has all 4 rounds within 2 MiB of up + down: a best so far, not final
    assert rows[("sparse", 2 * MIB_GIB)] == (pytest.approx(0.8), 4, False)
    assert rows[("sparse", 8 * MIB_GIB)][2] is False
    none = curves_at_caps(_curves(), "global_accuracy", [0.1 * MIB_GIB])
    assert none.filter(pl.col("run") == "fedavgm")["best"].to_list() == [None]
    assert none.filter(pl.col("run") == "fedavgm")["last_round"].to_list() == [None]


def test_bad_caps_axes_and_tables_are_named() -> None:
    t = _run_table()
    with pytest.raises(InputError, match=r"upload cap: 0 GiB is not > 0"):
        best_within_cap(t, "global/accuracy", 0)
    with pytest.raises(InputError, match=r"'both' is not an axis \(allowed: \['up_down', 'up'\]\)"):
        best_within_cap(t, "global/accuracy", 1.0, "both")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"axis 'up_down': the table lacks cum_bytes or cum_gib"):
        best_within_cap(t.drop("cum_bytes"), "global/accuracy", 1.0)
    with pytest.raises(InputError, match=r"axis 'up': the table lacks cum_up_bytes"):
        best_within_cap(t.drop("cum_up_bytes"), "global/accuracy", 1.0, "up")
    assert best_within_cap(t, "local/accuracy", 1.0) is None  # a metric the run lacks


def _ledger() -> pl.DataFrame:
    """1 MiB down and 1 MiB up in each of rounds 1-4 (the schema of test_summaries' ledger)."""
    rows = [(r, 0, d, 2**23, 0, 0, 2**23) for r in (1, 2, 3, 4) for d in ("down", "up")]
    return pl.DataFrame(rows, schema=LEDGER.schema, orient="row")


def test_summarize_run_scores_caps_on_the_chosen_axis() -> None:
    rounds = pl.DataFrame(
        {"round": [1, 2, 3, 4], "global/accuracy": ACC, "time/round_s": [1.0] * 4},
        schema_overrides={"round": pl.Int32},
    )
    clients = pl.DataFrame(
        {
            "round": [1, 2, 3, 4],
            "client_id": [0] * 4,
            "num_examples": [5] * 4,
            "train_s": [0.5] * 4,
        },
        schema_overrides={"round": pl.Int32, "client_id": pl.Int32},
    )
    caps = [2 * MIB_GIB, 4 * MIB_GIB]
    default = summarize_run(rounds, _ledger(), clients, upload_caps_gib=caps, budgets_gib=caps)
    up = summarize_run(rounds, _ledger(), clients, upload_caps_gib=caps, upload_cap_axis="up")
    assert list(default["at_upload_cap"].values()) == [0.2, 0.5]
    assert default["at_upload_cap"] == default["at_budget"]  # up + down is the budget axis
    assert list(up["at_upload_cap"].values()) == [0.5, 0.9]


def test_evaluate_upload_cap_axis_is_validated_and_defaults_to_up_down() -> None:
    assert validate_params(tiny_params()).evaluate.upload_cap_axis == "up_down"
    p = validate_params(tiny_params(**{"evaluate.upload_cap_axis": "up"}))
    assert p.evaluate.upload_cap_axis == "up"
    with pytest.raises(ConfigError) as info:
        validate_params(tiny_params(**{"evaluate.upload_cap_axis": "upload"}))
    assert "evaluate.upload_cap_axis: Input should be 'up_down' or 'up'" in str(info.value)
