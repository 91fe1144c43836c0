"""ProgFed's warm-up communication charge (issue 15; specs/feddst-progfed.md §2(c)).

The paper's ResNet-18/CIFAR-100 cost (S = 4, W = 25, T = 3000, T_s = 375) is 77.10% of dense
end-to-end (Table 3: −22.90%; Tables 5 and 11: 77.10). Every reading of a warm-up round's cost
is computed here from the counted sub-models; only the official code's accumulating counter
(``warmup_charge: code_counter``) comes near it, and that counter reproduces all seven ProgFed
costs of Table 12 to the GB.
"""

from __future__ import annotations

import functools

import polars as pl
import pytest
import torch
from pydantic import ValidationError
from tests.conftest import digits_federation, tiny_cnn, tiny_params
from tests.unit.algorithms.test_progfed import _run

from fedcomm.algorithms.progfed import Config
from fedcomm.algorithms.progfed.charge import charged_values
from fedcomm.algorithms.progfed.schedule import Phase, schedule, warmup_index
from fedcomm.config import Params
from fedcomm.models import build_model
from fedcomm.models.progressive import ProgressiveNet
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors

PAPER = 0.7710  # Table 3 (CR −22.90%), Tables 5 / 11 (77.10)
K = 40  # clients per round (CIFAR-100)
GB = K * 4 / 1e9  # the code's counter: K · values · 4 bytes, in 1e9 bytes


@functools.cache
def resnet18_sizes(stages: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """``(P_1..P_S, |E_s| + |G_s| for s = 1..S, full model)`` of ResNet-18 for CIFAR-100."""
    torch.manual_seed(0)
    base = build_model("resnet18", input_shape=(3, 32, 32), num_classes=100)
    net = ProgressiveNet(base, stages, 100, torch.Generator().manual_seed(0))
    numel = {n: p.numel() for n, p in net.named_parameters()}
    sub = tuple(net.submodel_numel(s) for s in range(1, stages + 1))
    new = tuple(
        sum(numel[k] for k in [*net.block_params(s), *net.head_params(s)])
        for s in range(1, stages + 1)
    )
    return sub, new, net.dense_numel()


def code_phases(rounds: int, stages: int, cycle: int, warmup: int) -> list[Phase]:
    """The official ``main.py`` loop: stage ``s + 1`` starts at round ``s·cycle`` (so stage 1
    lasts ``cycle − 1`` rounds), preceded by ``warmup`` extra rounds."""
    out: list[Phase] = []
    s = 1
    for t in range(1, rounds + 1):
        if s < stages and t == s * cycle:
            s += 1
            out += [Phase(s, True, t)] * warmup
        out.append(Phase(s, False, t))
    return out


def inside_t(rounds: int, stages: int, warmup: int) -> list[Phase]:
    """Reading (c): the W warm-up rounds are the first W rounds of each stage s ≥ 2 (in T)."""
    out: list[Phase] = []
    start: dict[int, int] = {}
    for i, ph in enumerate(schedule(rounds, stages, 0)):
        start.setdefault(ph.stage, i)
        warm = ph.stage > 1 and i - start[ph.stage] < warmup
        out.append(Phase(ph.stage, warm, ph.t))
    return out


def two_way(charges: list[tuple[int, int]], rounds: int, dense: int) -> float:
    """Both directions against dense end-to-end (``comm.cost_vs_dense_e2e``)."""
    return sum(d + u for d, u in charges) / (2 * rounds * dense)


def test_warmup_index_counts_within_each_growth() -> None:
    phases = schedule(12, 3, 2)  # 1 1 W W 2 2 W W 3 x 8
    assert warmup_index(phases) == [0, 0, 1, 2, 0, 0, 1, 2] + [0] * 8


def test_resnet18_cifar100_warmup_readings_against_the_paper() -> None:
    """Every reading, ResNet-18 (C = 100), S = 4, W = 25, T = 3000 (T_s = 375):

    ====================================================================  =======
    reading                                                               cost
    ====================================================================  =======
    no warm-up (the old check (v): Σ T_s·P_s / T·P_S)                     66.56%
    (a) ``sent``: M^s down, E_s + G_s up, W extra rounds (fedcomm)        67.52%
    (b) M^s both ways in the W extra rounds                               67.65%
    (c) warm-up inside T (M^s both ways / ``sent``)                       66.56% / 66.43%
    (d) ``code_counter``: P_{s−1} + w·|E_s + G_s| both ways               77.56%
    (d) with the code's schedule (stage 1 one round short)                77.59%
    (d) counting from 0 (w − 1) / from 0 without P_{s−1}                  76.73% / 77.29%
    paper, Table 3 / 5                                                    77.10%
    ====================================================================  =======
    """
    sub, new, dense = resnet18_sizes(4)
    assert sub == (156_324, 688_292, 2_800_804, 11_220_132)
    assert new == (156_324, 538_468, 2_125_412, 8_445_028)
    assert dense == sub[-1]
    T, W = 3000, 25
    extra = schedule(T, 4, W)
    assert len(extra) == T + 3 * W

    def ratio(phases: list[Phase], charge: str) -> float:
        return two_way(charged_values(phases, sub, new, charge), T, dense)  # type: ignore[arg-type]

    no_warmup = ratio(schedule(T, 4, 0), "sent")
    sent = ratio(extra, "sent")
    full_sub = sum(2 * sub[p.stage - 1] for p in extra) / (2 * T * dense)
    inside_full = sum(2 * sub[p.stage - 1] for p in inside_t(T, 4, W)) / (2 * T * dense)
    inside_sent = ratio(inside_t(T, 4, W), "sent")
    counter = ratio(extra, "code_counter")
    counter_code = ratio(code_phases(T, 4, 375, W), "code_counter")
    assert no_warmup == pytest.approx(0.66561, abs=1e-5)
    assert sent == pytest.approx(0.67520, abs=1e-5)  # fedcomm's default: the issue's 67.5%
    assert full_sub == pytest.approx(0.67654, abs=1e-5)
    assert inside_full == pytest.approx(no_warmup)
    assert inside_sent == pytest.approx(0.66428, abs=1e-5)
    assert counter == pytest.approx(0.77558, abs=1e-5)
    assert counter_code == pytest.approx(0.77591, abs=1e-5)
    # the counter's neighbours: w counted from 0, or the counter started at 0 instead of P_{s−1}
    base = sum(sub[p.stage - 1] for p in extra if not p.warmup)
    from_zero_w = sum(W * sub[s - 2] + W * (W - 1) // 2 * new[s - 1] for s in (2, 3, 4))
    no_prev = sum(W * (W + 1) // 2 * new[s - 1] for s in (2, 3, 4))
    assert (base + from_zero_w) / (T * dense) == pytest.approx(0.76733, abs=1e-5)
    assert (base + no_prev) / (T * dense) == pytest.approx(0.77287, abs=1e-5)
    # only the code's counter comes within a point of the paper; everything sent-based is ~10 off
    assert abs(counter - PAPER) < 0.005 and abs(counter_code - PAPER) < 0.005
    for other in (no_warmup, sent, full_sub, inside_full, inside_sent):
        assert PAPER - other > 0.09


@pytest.mark.parametrize(
    ("stages", "rounds", "cycle", "paper_gb"),
    [
        (3, 3000, 500, 4418),
        (4, 3000, 375, 4179),
        (5, 3000, 300, 4264),
        (8, 3000, 200, 3901),
        (3, 4000, 666, 5695),
        (5, 4000, 400, 5479),
        (8, 4000, 250, 5166),
    ],
)
def test_code_counter_reproduces_table12_costs(
    stages: int, rounds: int, cycle: int, paper_gb: int
) -> None:
    """Table 12 (ResNet-18/CIFAR-100, W = 25, the yaml's ``update-cycle``): ProgFed's cost in GB
    is the code's counter over the code's schedule, to the GB, for every S and T."""
    sub, new, _ = resnet18_sizes(stages)
    charges = charged_values(code_phases(rounds, stages, cycle, 25), sub, new, "code_counter")
    assert round(sum(up for _, up in charges) * GB) == paper_gb


def test_table12_baseline_and_ratio() -> None:
    """Dense end-to-end over T = 3000 is 5385.7 GB, but Table 12 prints 5368 (2990 rounds' worth).
    Both ratios of the S = 4 run sit above Table 3's 77.10%: the counter's 4178.8 / 5385.7 = 77.59%
    and Table 12's own 4179 / 5368 = 77.85%. No counting rule gives 77.10; the last half point
    is not in the accounting (the paper's figure was presumably read off its logged runs)."""
    sub, new, dense = resnet18_sizes(4)
    assert 3000 * dense * GB == pytest.approx(5385.66, abs=0.01)
    assert round(2990 * dense * GB) == 5368
    charges = charged_values(code_phases(3000, 4, 375, 25), sub, new, "code_counter")
    assert sum(up for _, up in charges) * GB == pytest.approx(4178.78, abs=0.01)
    assert round(4179 / 5368, 4) == 0.7785  # Table 12's own S = 4 ratio


# --- the flag in a run -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _sizes(fed: FederatedTensors, stages: int) -> tuple[list[int], list[int]]:
    net = ProgressiveNet(tiny_cnn(fed), stages, fed.num_classes, torch.Generator().manual_seed(0))
    numel = {n: p.numel() for n, p in net.named_parameters()}
    sub = [net.submodel_numel(s) for s in range(1, stages + 1)]
    new = [
        sum(numel[k] for k in [*net.block_params(s), *net.head_params(s)])
        for s in range(1, stages + 1)
    ]
    return sub, new


def _ledger_bits(res: loop.RunResult, direction: str) -> list[list[int]]:
    frame = res.ledger.frame().filter(pl.col("direction") == direction)
    total = frame.with_columns(
        (pl.col("payload_bits") + pl.col("index_bits") + pl.col("meta_bits")).alias("bits")
    )
    rounds = sorted(set(total["round"].to_list()))
    return [total.filter(pl.col("round") == r)["bits"].to_list() for r in rounds]


@pytest.mark.parametrize("charge", ["sent", "code_counter"])
def test_ledger_charges_the_flags_values_and_training_is_unchanged(
    fed: FederatedTensors, charge: str
) -> None:
    res = _run(fed, 6, stages=3, warmup_rounds=2, warmup_charge=charge)
    assert Config().warmup_charge == "sent"  # the default
    sub, new = _sizes(fed, 3)
    want = charged_values(schedule(6, 3, 2), sub, new, charge)  # type: ignore[arg-type]
    assert _ledger_bits(res, "down") == [[32 * d] * 3 for d, _ in want]
    assert _ledger_bits(res, "up") == [[32 * u] * 3 for _, u in want]
    if charge == "code_counter":  # warm-up round w of stage s books P_{s−1} + w·|E_s + G_s|
        # rounds: 1, W, W, 2, W, W, 3 x 4 (T_s = 1)
        assert want[1] == (sub[0] + new[1],) * 2 and want[2] == (sub[0] + 2 * new[1],) * 2
        assert want[4] == (sub[1] + new[2],) * 2 and want[5] == (sub[1] + 2 * new[2],) * 2
        sent = _run(fed, 6, stages=3, warmup_rounds=2)
        for k, v in sent.final_params.items():  # the charge changes no computation
            assert torch.equal(res.final_params[k], v), k
        assert [r["global/accuracy"] for r in res.state.round_rows] == [
            r["global/accuracy"] for r in sent.state.round_rows
        ]


def test_code_counter_extra_is_charged_uncompressed_next_to_an_lq_uplink(
    fed: FederatedTensors,
) -> None:
    counter = _run(fed, 4, compressor="lq", stages=2, warmup_rounds=2, warmup_charge="code_counter")
    sent = _run(fed, 4, compressor="lq", stages=2, warmup_rounds=2)
    sub, new = _sizes(fed, 2)
    phases = schedule(4, 2, 2)  # 1 1 W W 2 2
    for r, (ph, w) in enumerate(zip(phases, warmup_index(phases), strict=True)):
        extra = (sub[0] + w * new[1] - new[1]) if ph.warmup else 0
        got = _ledger_bits(counter, "up")[r]
        assert got == [b + 32 * extra for b in _ledger_bits(sent, "up")[r]], r
    for k, v in sent.final_params.items():
        assert torch.equal(counter.final_params[k], v), k


def test_warmup_charge_is_validated_by_name() -> None:
    with pytest.raises(ValidationError, match=r"warmup_charge\n.*'sent' or 'code_counter'"):
        Config(warmup_charge="paper")
    raw = tiny_params(**{"train.rounds": 8, "experiment.runs": ["pf"]})
    raw["algorithms"] = {"pf": {"name": "progfed", "stages": 2, "warmup_charge": "paper"}}
    with pytest.raises(ValidationError, match=r"algorithms\.pf\.progfed\.warmup_charge"):
        Params.model_validate(raw)
    raw["algorithms"] = {"pf": {"name": "progfed", "stages": 2, "warmup_charge": "code_counter"}}
    cfg = Params.model_validate(raw).algorithm("pf")
    assert isinstance(cfg, Config) and cfg.warmup_charge == "code_counter"
