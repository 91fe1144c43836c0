"""Small pieces of the round loop's contract: client-metric aggregation, ensembles, cohorts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fedcomm.algorithms.core import join_members, split_members
from fedcomm.evaluation.metrics import evaluate
from fedcomm.simulation.loop import sample_cohort
from fedcomm.simulation.round_metrics import aggregate_client_metrics


def test_client_metrics_mean_max_min() -> None:
    per_client = [
        {"train/loss": 1.0, "x/tv_mean": 0.2, "x/tv_max": 0.5, "x/z_min": 3.0},
        {"train/loss": 2.0, "x/tv_mean": 0.4, "x/tv_max": 0.9, "x/z_min": 1.0},
        {"x/tv_mean": math.nan},
    ]
    out = aggregate_client_metrics(per_client)
    assert out == pytest.approx({"x/tv_mean": 0.3, "x/tv_max": 0.9, "x/z_min": 1.0})


def test_members_round_trip() -> None:
    a = {"w": torch.ones(2), "b": torch.zeros(1)}
    b = {"w": torch.full((2,), 2.0), "b": torch.ones(1)}
    joined = join_members([a, b])
    assert sorted(joined) == ["member0.b", "member0.w", "member1.b", "member1.w"]
    back = split_members(joined)
    assert [sorted(m) for m in back] == [["b", "w"], ["b", "w"]]
    assert torch.equal(back[1]["w"], b["w"])
    assert split_members(a) == [a]


def test_ensemble_evaluation_averages_softmax() -> None:
    # member A predicts class 0 with p=0.9, member B class 1 with p=0.6 -> mean [0.65, 0.35]
    model = nn.Linear(1, 2, bias=True)
    la, lb = math.log(0.9 / 0.1), math.log(0.6 / 0.4)
    a = {"weight": torch.zeros(2, 1), "bias": torch.tensor([la, 0.0])}
    b = {"weight": torch.zeros(2, 1), "bias": torch.tensor([0.0, lb])}
    x, y = torch.zeros(4, 1), torch.tensor([0, 0, 1, 1])
    r = evaluate(model, [a, b], x, y)
    assert r.accuracy == 0.5  # always predicts class 0
    assert r.loss == pytest.approx(-(2 * math.log(0.65) + 2 * math.log(0.35)) / 4, rel=1e-6)
    single = evaluate(model, [a], x, y)
    assert single.loss == pytest.approx(evaluate(model, a, x, y).loss)


def test_cohort_is_sorted_distinct_and_seeded() -> None:
    c = sample_cohort(3, 5, 100, 10)
    assert c == sorted(set(c)) and len(c) == 10
    assert c == sample_cohort(3, 5, 100, 10)
    assert c != sample_cohort(3, 6, 100, 10)
    with pytest.raises(ValueError, match="clients_per_round"):
        sample_cohort(3, 5, 4, 10)


def test_warm_start_runs_once_and_is_charged_as_round_zero(tmp_path: Path) -> None:
    from dataclasses import replace

    from fedcomm.algorithms import fedavg
    from fedcomm.algorithms.core.local import LocalConfig
    from fedcomm.comm.codecs import build_compressor, encode_dense
    from fedcomm.models import build_model
    from fedcomm.simulation import loop
    from tests.conftest import digits_federation

    fed = digits_federation(4)
    calls: list[int] = []

    def warm_start(state: Any, train: Any, ctx: Any) -> Any:
        calls.append(len(train))
        zeroed = {k: torch.zeros_like(v) for k, v in state.params.items()}
        return replace(state, params=zeroed), [(2, "up", encode_dense({"w": torch.ones(10)}))]

    algo = replace(fedavg.build(fedavg.Config()), warm_start=warm_start)
    cfg = loop.LoopConfig(
        rounds=2, clients_per_round=2, local=LocalConfig(steps=1, epochs=None, batch_size=8),
        seed=0, eval_every=2, checkpoint_every=1,
    )  # fmt: skip

    def run(resume: bool) -> loop.RunResult:
        torch.manual_seed(0)
        model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[8])
        return loop.run(
            cfg, algo, model, fed, build_compressor("none"), config_hash="h",
            checkpoint_path=tmp_path / "ckpt", resume=resume,
        )  # fmt: skip

    res = run(resume=False)
    assert calls == [4]  # once, with every client's train split
    round0 = [r for r in res.ledger.rows if r[0] == 0]
    assert round0 == [(0, 2, "up", 320, 0, 0, 320, "sent", 320, 0)]
    up1 = sum(r[3] + r[4] + r[5] for r in res.ledger.rows if r[0] == 1)
    assert res.state.round_rows[0]["comm/cum_bytes"] == (320 + up1) / 8
    again = run(resume=True)  # finished: nothing runs again, the warm start included
    assert calls == [4] and again.ledger.rows == res.ledger.rows
