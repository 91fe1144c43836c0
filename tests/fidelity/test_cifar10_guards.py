"""Fidelity guards at paper scale: FedSparse's CIFAR-10 Table 1 profile, cut to its first rounds.

The reproduction (``make reproduce NAME=fedsparse_cifar10``; ``docs/reproductions/fedsparse.md``,
``docs/reproductions/data/fedsparse_cifar10.csv``) established on the CIFAR-10 JPEG copy, 3 seeds:

- FedDrop (conv 0.1, fc 0.5, unscaled) trains *behind* FedAvg, the opposite of the paper's Table 1
  (69.9 vs 69.7): by 3.3 to 5.8 points at round 10, 5.2 to 8.2 at round 30 and 4.2 ± 0.5 at the
  end (verdict `fedsparse-cifar10-feddrop`: not reproduced);
- FedSparse "mid" (λ0 = 5e-6) reaches 20-26% sparsity by round 10 (31-36% by round 20) while the
  paper's "low" λ0 (5e-7) stays almost dense (about 1%): the λ0 -> sparsity map of check
  `fedsparse-cifar10-lambda0-map`.

Each guard runs the REAL profile file (``pipeline/reproductions/fedsparse_cifar10.yaml``) through
the train stage's own builders (partition, model init, algorithm, loop config), seed 0, with only
the keys in :data:`CUT` changed; the test checks that nothing else moved. The cut keeps the
partition the numbers above were measured on, Dirichlet α 1.0 (the profile's α is 0.2 since
issue 41's calibration; at α 0.2 FedDrop is 1.75 points behind FedAvg at round 30, seed 0). A
regression in the image loader, the LeNet-5 model, FedDrop's masks, the Adam server or
FedSparse's gates moves these numbers out of their bands. Costs ~1.5 min on 2 CPU cores (the
decode of the 60,000 JPEGs included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fedcomm.config import Params, read_yaml_mapping, validate_params
from fedcomm.simulation.data import FederatedTensors
from fedcomm.stages.partition import draw_partition, load_data
from fedcomm.stages.train import train_in_memory
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.fidelity]

PROFILE = REPO / "pipeline" / "reproductions" / "fedsparse_cifar10.yaml"
#: the keys the cut changes (dotted); everything else is the profile's
CUT = {
    "data.root",
    "train.rounds",
    "train.eval_every",
    "train.local_eval_every",
    "train.device",
    "experiment.seeds",
    "partition.alpha",  # the numbers' partition: α 1.0 (the table runs before issue 41)
}
GUARD_ALPHA = 1.0


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _cut(raw: dict[str, Any], data_root: Path, rounds: int) -> dict[str, Any]:
    cut = {**raw, "data": {**raw["data"], "root": str(data_root)}}
    cut["train"] = {
        **raw["train"],
        "rounds": rounds,
        "eval_every": rounds,  # one evaluation, at the end
        "local_eval_every": rounds,
        "device": "cpu",  # the CPU's numbers on every machine
    }
    cut["experiment"] = {**raw["experiment"], "seeds": [0]}
    cut["partition"] = {**raw["partition"], "alpha": GUARD_ALPHA}
    return cut


@pytest.fixture(scope="module")
def profile(cifar_root: Path) -> tuple[Params, FederatedTensors]:
    """The profile's params (cut to 30 rounds) and its federation: 100 Dirichlet(1.0) shards."""
    raw = read_yaml_mapping(PROFILE)
    params = validate_params(_cut(raw, cifar_root, 30), str(PROFILE))
    dataset = load_data(params)
    part = draw_partition(params, dataset)
    return params, FederatedTensors.build(dataset, part.train, part.test)


def _final(params: Params, data: FederatedTensors, run: str, rounds: int) -> dict[str, Any]:
    """Seed 0 of ``run`` for ``rounds`` rounds; the last round's metrics."""
    each = {"rounds": rounds, "eval_every": rounds, "local_eval_every": rounds}
    train = params.train.model_copy(update=each)
    p = params.model_copy(update={"train": train})
    return dict(train_in_memory(p, run, 0, data).state.round_rows[-1])


def test_the_cut_changes_only_its_keys(cifar_root: Path) -> None:
    raw = read_yaml_mapping(PROFILE)
    before, after = _flat(raw), _flat(_cut(raw, cifar_root, 30))
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed <= CUT, changed - CUT
    assert validate_params(_cut(raw, cifar_root, 30), str(PROFILE)).train.clients_per_round == 10


def test_feddrop_trains_behind_fedavg_on_cifar10(
    profile: tuple[Params, FederatedTensors],
) -> None:
    params, data = profile
    # the reproduction at round 10, seed 0 / 1 / 2: FedAvg 20.0 / 24.1 / 20.6, FedDrop 14.4 /
    # 18.3 / 17.4 (3.3 to 5.8 points behind; at round 30 5.2 to 8.2, but round 20 has seed 1's
    # FedDrop level with FedAvg, so the guard reads round 10, a third of the cost of round 30);
    # this guard, seed 0 on one thread, gives 0.2003 and 0.1493 (5.1 points behind). A lost
    # effect (FedDrop's masks as no-ops, or its kept units rescaled twice) closes the gap; a
    # broken loader or model sits near 10%
    fedavg = float(_final(params, data, "fedavg", 10)["global/accuracy"])
    feddrop = float(_final(params, data, "feddrop", 10)["global/accuracy"])
    assert 0.16 <= fedavg <= 0.30, fedavg
    assert 0.12 <= feddrop <= fedavg - 0.025, (feddrop, fedavg)


def test_fedsparse_lambda0_sets_the_sparsity_on_cifar10(
    profile: tuple[Params, FederatedTensors],
) -> None:
    params, data = profile
    # the reproduction at round 10: "mid" (5e-6) 23.2 / 26.0 / 20.5% sparse (seeds 0-2) at
    # 14.2-17.3% accuracy, "low" (5e-7) 0.9-1.0% at 18.5-23.1% (FedAvg: 20.0-24.1%); this guard
    # gives seed 0's numbers exactly (mid: 0.2317 sparse at 0.1537)
    mid = _final(params, data, "fedsparse_mid", 10)
    low = _final(params, data, "fedsparse_low", 10)
    assert 0.15 <= float(mid["model/sparsity"]) <= 0.40, mid["model/sparsity"]
    assert float(low["model/sparsity"]) <= 0.05, low["model/sparsity"]
    for row in (mid, low):
        assert float(row["global/accuracy"]) >= 0.12, row["global/accuracy"]  # chance: 0.10
