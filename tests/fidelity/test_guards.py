"""Fidelity guards: short seeded runs on real MNIST whose outcome the reproductions established.

Each guard is a scaled-down version of a reproduction profile (``pipeline/reproductions/``,
results in ``docs/reproductions/``), cheap enough for CI, with ranges wide enough to hold across
seeds but narrow enough to catch a collapse or a lost effect:

- FedBIAD's default (masked Eq. 10) trains to within a few points of FedAvg, while Eq. 10 as
  printed (``aggregation: eq10``) falls well behind it: the reason the default is not the literal
  reading (issue 15);
- FedSparse's default λ0 and a stronger one reach known sparsity bands at FedAvg's accuracy;
- FedDST keeps exactly the density it promises and uploads ~1/(1 − S) less than FedAvg;
- ProgFed sends exactly its active sub-models and trains past its first stages.

All runs use the vectorized backend where it applies (the same numbers as the sequential one,
``tests/contract/test_backends.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcomm.algorithms import build_algorithm, fedavg, fedbiad, feddst, fedsparse, progfed
from fedcomm.algorithms.core import AlgorithmConfig
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.data.datasets.registry import load_dataset
from fedcomm.data.federated import PartitionSpec, make_partition
from fedcomm.models.registry import build_model
from fedcomm.server_opt import ServerOptConfig
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors

pytestmark = [pytest.mark.slow, pytest.mark.fidelity]


def _federation(
    data_root: Path, kind: str, clients: int, params: Mapping[str, Any], *, normalize: bool
) -> Any:
    ds = load_dataset("mnist", data_root, normalize=normalize)
    part = make_partition(ds, PartitionSpec(kind, clients, dict(params), 0.2, 0))
    return FederatedTensors.build(ds, part.train, part.test)


@pytest.fixture(scope="module")
def label_cycle(data_root: Path) -> FederatedTensors:
    """FedBIAD's partition, scaled down: 200 clients, pFedBayes' 5 labels each (standardised)."""
    return _federation(data_root, "label_cycle", 200, {"labels_per_partition": 5}, normalize=True)


@pytest.fixture(scope="module")
def dirichlet(data_root: Path) -> FederatedTensors:
    """FedSparse's partition, scaled down: Dirichlet(1.0) over 50 clients (pixels in [0, 1])."""
    params = {"alpha": 1.0, "min_partition_size": 50}
    return _federation(data_root, "dirichlet", 50, params, normalize=False)


def _run(
    cfg: AlgorithmConfig,
    fed: FederatedTensors,
    *,
    rounds: int,
    per_round: int,
    local: LocalConfig,
    hidden: list[int],
    seed: int = 0,
) -> loop.RunResult:
    torch.manual_seed(seed)
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=hidden)
    lcfg = loop.LoopConfig(
        rounds=rounds,
        clients_per_round=per_round,
        local=local,
        seed=seed,
        eval_every=rounds,
        backend="vectorized",
    )
    alg = build_algorithm(cfg.with_rounds(rounds))
    return loop.run(lcfg, alg, model, fed, build_compressor("none"), config_hash="guard")


def _final(result: loop.RunResult, key: str = "global/accuracy") -> float:
    value = result.state.round_rows[-1][key]
    assert value is not None
    return float(value)


def test_fedbiad_default_tracks_fedavg_and_eq10_as_printed_does_not(
    label_cycle: FederatedTensors,
) -> None:
    # fedbiad_mnist.yaml scaled down: 200 clients, 20 a round, 30 rounds, R_b = 25, τ = 3,
    # p = 0.2, V = 20 steps of batch 20. Measured (seed 0): FedAvg ~0.91, default ~0.89,
    # eq10 ~0.78 at round 20 and falling.
    kw: dict[str, Any] = {
        "rounds": 30,
        "per_round": 20,
        "local": LocalConfig(steps=20, batch_size=20, lr=0.1),
        "hidden": [64],
    }
    base = _final(_run(fedavg.Config(), label_cycle, **kw))
    default = _final(_run(fedbiad.Config(stage_boundary=25), label_cycle, **kw))
    literal = _final(_run(fedbiad.Config(stage_boundary=25, aggregation="eq10"), label_cycle, **kw))
    assert base > 0.85, base
    assert default >= base - 0.04, (default, base)
    assert literal <= default - 0.05, (literal, default)


FEDSPARSE_RUN: dict[str, Any] = {
    "rounds": 30,
    "per_round": 10,
    "local": LocalConfig(epochs=1, batch_size=32, lr=0.05),
    "hidden": [100],
}


@pytest.fixture(scope="module")
def fedavg_adam(dirichlet: FederatedTensors) -> float:
    """FedAvg's final accuracy with server Adam 1e-3, the FedSparse guards' baseline."""
    adam = ServerOptConfig(optimizer="adam", lr=1e-3)
    return _final(_run(fedavg.Config(weighting="uniform", server=adam), dirichlet, **FEDSPARSE_RUN))


@pytest.mark.parametrize(
    ("lambda0", "low", "high"),
    [(3e-6, 0.0, 0.1), (5e-6, 0.25, 0.6)],  # a weaker λ0, and the default
)
def test_fedsparse_sparsity_band_at_fedavg_accuracy(
    dirichlet: FederatedTensors, fedavg_adam: float, lambda0: float, low: float, high: float
) -> None:
    # fedsparse_mnist.yaml scaled down: 50 clients, 10 a round, 30 rounds, MLP 784-100-10, one
    # epoch of SGD at 0.05 (batch 32), server Adam 1e-3 for both methods. Measured (seeds 0, 1):
    # FedAvg 0.843 / 0.854; λ0 3e-6: sparsity 0.019 / 0.018 at 0.840 / 0.852; the default
    # λ0 5e-6: 0.42 / 0.39 at 0.835 / 0.849. The two bands sit on either side of the threshold
    # where a group without data signal turns from kept to pruned, λ0* = c_CE·logit(θ0)/|g| =
    # 1e-4·logit(0.99)/100 = 4.6e-6 for the first layer's input groups (|g| = 100 outputs);
    # docs/reproductions/fedsparse.md shows the step move with c_CE.
    sparse = _run(fedsparse.Config(lambda0=lambda0), dirichlet, **FEDSPARSE_RUN)
    sparsity = _final(sparse, "model/sparsity")
    assert low <= sparsity <= high, sparsity
    assert _final(sparse) >= fedavg_adam - 0.03, (_final(sparse), fedavg_adam)


def test_feddst_keeps_its_density_and_uploads_one_fifth(dirichlet: FederatedTensors) -> None:
    kw: dict[str, Any] = {
        "rounds": 12,
        "per_round": 10,
        "local": LocalConfig(epochs=1, batch_size=32, lr=0.05),
        "hidden": [100],
    }
    base = _run(fedavg.Config(), dirichlet, **kw)
    sparse = _run(feddst.Config(sparsity=0.8, readjust_every=3), dirichlet, **kw)
    assert _final(sparse, "feddst/density") == pytest.approx(0.2, abs=0.01)
    up = sum(r[3] + r[4] + r[5] for r in sparse.ledger.rows if r[2] == "up")
    dense_up = sum(r[3] + r[4] + r[5] for r in base.ledger.rows if r[2] == "up")
    assert 4.5 <= dense_up / up <= 5.05, dense_up / up
    # measured (seed 0, 12 rounds): FedAvg 0.874, FedDST 0.772 (a 20%-dense net starts slower);
    # a collapse to the majority class would sit near 0.1
    assert _final(sparse) >= max(0.7, _final(base) - 0.15), (_final(sparse), _final(base))


def test_progfed_sends_its_sub_models_and_trains(
    dirichlet: FederatedTensors,
) -> None:
    kw: dict[str, Any] = {
        "rounds": 18,
        "per_round": 10,
        "local": LocalConfig(epochs=1, batch_size=32, lr=0.05),
        "hidden": [100, 100],
    }
    e2e = _run(progfed.Config(stages=1), dirichlet, **kw)
    prog = _run(progfed.Config(stages=3), dirichlet, **kw)

    def bits(r: loop.RunResult) -> int:
        return sum(row[3] + row[4] + row[5] for row in r.ledger.rows)

    # every round sends the active sub-model (with its head) both ways to 10 clients, 32 bits a
    # value: stages of T/(2S) = 3 rounds for E1 and E1-2, then the full model for 12 rounds
    sizes = [int(row["progfed/submodel_params"]) for row in prog.state.round_rows]
    full = int(e2e.state.round_rows[-1]["progfed/submodel_params"])
    assert sizes == [sizes[0]] * 3 + [sizes[3]] * 3 + [full] * 12
    assert sizes[0] < sizes[3] <= full  # an MLP head is its classifier: E1-2 + head = all
    assert bits(e2e) == 18 * 10 * 2 * 32 * full
    assert bits(prog) == 10 * 2 * 32 * sum(sizes)
    # measured (seed 0): end-to-end 0.861, ProgFed 0.815 (12 full-model rounds instead of 18)
    assert _final(prog) >= max(0.75, _final(e2e) - 0.08), (_final(prog), _final(e2e))
