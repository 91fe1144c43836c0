"""ProgFed's helper modules: the per-round lookups, the client rate and the counter's extra."""

from __future__ import annotations

import pytest

from fedcomm.algorithms.progfed.charge import (
    COUNTER,
    charged_values,
    counter_extra,
    round_charge,
    without_counter,
)
from fedcomm.algorithms.progfed.schedule import (
    Phase,
    at_round,
    client_lr,
    lr_factor,
    schedule,
    stage_length,
    warmup_index,
)


def test_at_round_clamps_to_the_schedule() -> None:
    phases = schedule(8, 2, 1)  # T_s = 2: stage 1 x2, warm-up x1, stage 2 x6
    assert len(phases) == 9
    assert at_round(phases, 0) == at_round(phases, 1) == Phase(1, False, 1)
    assert at_round(phases, 3) == Phase(2, True, 2)
    assert at_round(phases, 99) == phases[-1] == Phase(2, False, 8)


def test_stage_length_refuses_a_too_short_t() -> None:
    assert stage_length(12, 3) == 2  # ⌊12/6⌋
    assert stage_length(5, 1) == 5
    with pytest.raises(ValueError, match="too short"):
        stage_length(5, 3)


def test_client_lr_floors_only_a_scheduled_rate() -> None:
    warm = Phase(2, True, 4)
    assert lr_factor(warm, 10, "cosine") == 1.0
    assert lr_factor(Phase(1, False, 1), 10, "cosine") == 1.0  # cos(0)
    assert lr_factor(Phase(2, False, 10), 10, "constant") == 1.0
    assert lr_factor(Phase(2, False, 10), 10, "cosine") == pytest.approx(0.0, abs=1e-15)
    assert client_lr(0.1, 1.0, 0.5) == 0.1  # factor 1: the base rate, no floor
    assert client_lr(0.1, 0.5, 1e-6) == pytest.approx(0.05)
    assert client_lr(0.1, 0.0, 1e-6) == 1e-6


@pytest.mark.parametrize("charge", ["sent", "code_counter"])
def test_counter_extra_is_booked_minus_sent(charge: str) -> None:
    phases = schedule(12, 3, 2)
    submodel, new = [10, 25, 40], [10, 20, 30]
    sent = charged_values(phases, submodel, new, "sent")
    booked = charged_values(phases, submodel, new, "code_counter")
    for ph, w, s, b in zip(phases, warmup_index(phases), sent, booked, strict=True):
        extra = counter_extra(ph, w, submodel, new, charge)  # type: ignore[arg-type]
        if charge == "sent":
            assert extra == (0, 0)
        else:
            assert (s[0] + extra[0], s[1] + extra[1]) == b
    assert round_charge(Phase(3, True, 4), 2, submodel, new, "code_counter") == (85, 85)


def test_without_counter_drops_only_the_counter_entry() -> None:
    assert list(without_counter({"a": 1, COUNTER: 2, "b": 3})) == ["a", "b"]  # type: ignore[dict-item]
