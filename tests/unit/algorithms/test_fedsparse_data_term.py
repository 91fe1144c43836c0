"""FedSparse's ``data_term``: the minibatch mean CE (default) or Eq. 17's sum over the shard.

Under ``shard_sum`` the client objective is Eq. 17 divided by the client's N_s: the mean CE plus
the penalties (λ0, c_CE, λ terms) times 1/N_s. So on clients that all hold N examples it must
train exactly as ``mean`` with λ0/N and c_CE/N, and differ from ``mean`` at the same λ0 and c_CE.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fedcomm.algorithms import build_algorithm
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.fedsparse import algorithm as fedsparse
from fedcomm.algorithms.fedsparse.local import SCALE, objective, penalty_scale
from fedcomm.comm.codecs import build_compressor
from fedcomm.data.datasets.registry import load_dataset
from fedcomm.models import build_model
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors

N = 200  # training examples of every client


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    """6 clients of ``digits`` with N training and 40 test examples each."""
    ds = load_dataset("digits")
    rows = np.random.default_rng(0).permutation(len(ds.y))
    train = [rows[i * N : (i + 1) * N] for i in range(6)]
    test = [rows[6 * N + i * 40 : 6 * N + (i + 1) * 40] for i in range(6)]
    return FederatedTensors.build(ds, train, test)


def _run(fed: FederatedTensors, **cfg: object) -> loop.RunResult:
    torch.manual_seed(0)
    model = build_model(
        "mlp", input_shape=fed.input_shape, num_classes=fed.num_classes, hidden=[16]
    )
    lc = loop.LoopConfig(rounds=4, clients_per_round=3, local=LocalConfig(batch_size=16), seed=1)
    alg = build_algorithm(fedsparse.Config(gate_lr=1e-2, **cfg))  # type: ignore[arg-type]
    return loop.run(lc, alg, model, fed, build_compressor("none"), config_hash="d")


def _sparsity(run: loop.RunResult) -> float:
    return float(run.state.round_rows[-1]["model/sparsity"])


def test_shard_sum_is_the_mean_reading_with_penalties_over_n(fed: FederatedTensors) -> None:
    lambda0, ce = 3e-4, 1e-4  # above the no-data threshold c_CE·logit(0.99)/|g| of every group
    summed = _run(fed, lambda0=lambda0, ce_scale=ce, data_term="shard_sum")
    scaled = _run(fed, lambda0=lambda0 / N, ce_scale=ce / N)
    for k in summed.final_params:
        torch.testing.assert_close(summed.final_params[k], scaled.final_params[k])
    for k in summed.state.server.v:
        torch.testing.assert_close(summed.state.server.v[k], scaled.state.server.v[k])
    assert _sparsity(summed) == _sparsity(scaled)
    # the flag ignored would give the mean run: there the penalties outweigh the data N times
    # more, and it prunes far more (0.86 vs 0.44 when this test was written)
    mean = _run(fed, lambda0=lambda0, ce_scale=ce)
    assert _sparsity(mean) > _sparsity(summed) + 0.2, (_sparsity(mean), _sparsity(summed))


def test_objective_weighs_the_penalties_by_the_client_scale() -> None:
    spec_name, T = "fc.in", 1e-3
    from fedcomm.algorithms.fedsparse.local import COST, GATE, THETA, StepRule

    class _Spec:  # one group spec's view as `objective` reads it
        name = spec_name
        members = (("fc.weight", 1),)

    full = {
        "fc.weight": torch.ones(2, 3),
        GATE + spec_name: torch.zeros(3),
        THETA + spec_name: torch.full((3,), 0.9),
        COST + spec_name: torch.full((3,), 0.5),
        "logit." + spec_name: torch.tensor([2.0, -1.0, 0.5]),
    }
    rule = StepRule(T, 0.0, False, 1e-1, 0.0, 1e-3, "auto", True)
    loss = torch.tensor(1.25)
    plain = objective(full, loss, specs=[_Spec()], rule=rule)  # type: ignore[list-item]
    scale = penalty_scale(50, full["fc.weight"])
    assert float(scale[SCALE]) == pytest.approx(1 / 50)
    scaled = objective({**full, **scale}, loss, specs=[_Spec()], rule=rule)  # type: ignore[list-item]
    pi = torch.sigmoid(full["logit." + spec_name])
    theta = full[THETA + spec_name]
    penalties = (0.5 * pi).sum() - 1e-1 * (pi * theta.log() + (1 - pi) * (1 - theta).log()).sum()
    assert float(plain) == pytest.approx(float(loss + penalties), rel=1e-6)
    assert float(scaled) == pytest.approx(float(loss + penalties / 50), rel=1e-6)


def test_data_term_is_validated() -> None:
    assert fedsparse.Config().data_term == "mean"
    with pytest.raises(ValidationError, match="data_term"):
        fedsparse.Config(data_term="sum")  # type: ignore[arg-type]
