"""Fidelity guard at paper scale: FedDST's CIFAR-10 Table 2 profile, cut to its first rounds.

The table run (``pipeline/feddst_cifar10_caps.sh``; ``docs/reproductions/feddst.md``,
``pipeline/reproductions/ablations/feddst_cifar10_inputs.py``) established on the CIFAR-10 JPEG
copy, one change at a time on the same seeds and partitions:

- with the pixels in [0, 1] only, FedAvgM's global model collapses: from round 2-5 on it predicts
  one class (accuracy 8-12%) and its global loss climbs above ln 10 (2.57 / 2.70 / 2.97 on seeds
  0 / 1 / 2 at round 5, 2.5-3.5 by round 8), for all 36 rounds of the 4 GiB cut, on every seed;
- with the official code's per-channel standardization (the profile's ``data.dataset.normalize``)
  it learns: global loss at or under ln 10 through round 16 (round 5: 2.301 / 2.285 / 2.296 on
  seeds 0 / 1 / 2), and its best within 4 GiB is ~27-30% (the paper's 24.43).

The guard runs the REAL profile file (``pipeline/reproductions/feddst_cifar10.yaml``) through the
train stage's own builders, FedAvgM, seed 0 (partition seed 0, as the table's seed-0 build), with
only the keys in :data:`CUT` changed. A regression that drops the standardization (the loader,
the params' ``normalize``), or breaks the LotteryFL shards or the FedDST CNN, moves the loss out of
its band. It reads round 5, the first round where every seed's [0, 1] loss is above the band
(seed 0's round 4 is 2.335, inside it), 5/8 of the cost of round 8 (the test suite's time,
issue 43). Costs ~1 min on 2 CPU cores (the partition's test rows included; the JPEG decode
is cached by whichever CIFAR-10 test loads it first).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from fedcomm.config import read_yaml_mapping, validate_params
from fedcomm.simulation.data import FederatedTensors
from fedcomm.stages.partition import draw_partition, load_data
from fedcomm.stages.train import train_in_memory
from tests.conftest import REPO
from tests.fidelity.test_cifar10_guards import CUT as CIFAR10_CUT
from tests.fidelity.test_cifar10_guards import _flat

pytestmark = [pytest.mark.slow, pytest.mark.fidelity]

PROFILE = REPO / "pipeline" / "reproductions" / "feddst_cifar10.yaml"
ROUNDS = 5
#: the keys the cut changes (dotted): the CIFAR-10 Table 1 guards' and the runs
CUT = CIFAR10_CUT | {"experiment.runs"}


def _cut(raw: dict[str, Any], data_root: Path) -> dict[str, Any]:
    cut = {**raw, "data": {**raw["data"], "root": str(data_root)}}
    cut["train"] = {
        **raw["train"],
        "rounds": ROUNDS,
        "eval_every": ROUNDS,  # one evaluation, at the end
        "local_eval_every": 10 * ROUNDS,  # no local evaluation (400 clients' test rows)
        "device": "cpu",  # the CPU's numbers on every machine
    }
    cut["experiment"] = {**raw["experiment"], "seeds": [0], "runs": ["fedavgm"]}
    return cut


def test_the_cut_changes_only_its_keys(cifar_root: Path) -> None:
    raw = read_yaml_mapping(PROFILE)
    before, after = _flat(raw), _flat(_cut(raw, cifar_root))
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed <= CUT, changed - CUT
    params = validate_params(_cut(raw, cifar_root), str(PROFILE))
    normalize = params.data.dataset.normalize  # type: ignore[union-attr]
    assert normalize is not None and normalize.mean == [0.4914, 0.4822, 0.4465]


def test_fedavgm_learns_on_standardized_cifar10(cifar_root: Path) -> None:
    params = validate_params(_cut(read_yaml_mapping(PROFILE), cifar_root), str(PROFILE))
    dataset = load_data(params)
    part = draw_partition(params, dataset)
    data = FederatedTensors.build(dataset, part.train, part.test)
    row = dict(train_in_memory(params, "fedavgm", 0, data).state.round_rows[-1])
    # the table's seed 0 at round 5: loss 2.301, accuracy 0.107; on [0, 1] pixels the same
    # round gives 2.571 / 0.113, 2.702 / 0.099 and 2.965 / 0.096 (seeds 0 / 1 / 2): a collapsed
    # model (its accuracy near chance either way; the loss is what tells them apart). This
    # guard, on one thread, gives 2.3055 / 0.1067
    loss, acc = float(row["global/loss"]), float(row["global/accuracy"])
    assert loss <= math.log(10) + 0.05, (loss, acc)
    assert acc >= 0.10, (loss, acc)
