"""The loop's per-round upload metrics agree with its ledger: cumulative upload, ratio vs dense."""

from __future__ import annotations

import pytest
import torch

from fedcomm.algorithms import fedavg
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.models import build_model
from fedcomm.simulation import loop
from tests.conftest import digits_federation


def _run(compressor: str, **options: object) -> loop.RunResult:
    fed = digits_federation(4)
    cfg = loop.LoopConfig(
        rounds=3, clients_per_round=2, local=LocalConfig(steps=1, epochs=None, batch_size=8),
        seed=0, eval_every=3,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[8])
    algo = fedavg.build(fedavg.Config())
    return loop.run(cfg, algo, model, fed, build_compressor(compressor, **options), config_hash="h")


@pytest.mark.parametrize(("compressor", "options"), [("none", {}), ("fedpaq", {"levels": 7})])
def test_cum_upload_and_up_ratio_match_the_ledger(
    compressor: str, options: dict[str, object]
) -> None:
    res = _run(compressor, **options)
    cum_up = 0
    for row in res.state.round_rows:
        up = [r for r in res.ledger.rows if r[0] == row["round"] and r[2] == "up"]
        sent = sum(r[3] + r[4] + r[5] for r in up)
        cum_up += sent
        assert row["comm/cum_up_bytes"] == cum_up / 8
        dense = len(up) * 32 * (64 * 8 + 8 + 8 * 10 + 10)  # mlp 64-8-10
        assert row["comm/up_ratio"] == pytest.approx(dense / sent)
    ratios = [row["comm/up_ratio"] for row in res.state.round_rows]
    if compressor == "none":
        assert ratios == [1.0, 1.0, 1.0]
    else:  # 3 bits + sign per entry, plus a norm per tensor: about 32 / 4
        assert all(6 < r < 8 for r in ratios)
