"""FedSparse's λ0 -> sparsity map on the CIFAR-10 Table 1 profile: a one-change scan of λ0.

    FEDCOMM_DATA_ROOT=../shared/data .venv/bin/python \\
        pipeline/reproductions/ablations/fedsparse_cifar10_lambda0_scan.py ROUNDS SEED LAMBDA0...

Runs ``fedsparse_low`` of ``pipeline/reproductions/fedsparse_cifar10.yaml`` (the table run's
partition, model, training and FedSparse defaults) for ROUNDS rounds with only ``lambda0`` changed,
on the CPU, and prints one JSON line per λ0: the sparsity and global accuracy after the last round.

The diagnosis it tests (docs/reproductions/fedsparse.md, Diagnoses): a group of |g| parameters
with little data gradient closes when λ0·|g| > c_CE·logit(θ0), so each layer has a threshold
λ0* = c_CE·logit(θ0)/|g| = 4.6e-4/|g|. On LeNet-5 (`cnn`): conv1 6.0e-6 (|g| = 76, 2,432
parameters), conv2 5.7e-7 (|g| = 801, 51,264), fc1 9.0e-7 (|g| = 512, 819,712), fc2 4.6e-5
(|g| = 10, 5,130). The paper's "low" λ0 (5e-7) is under every threshold, so it should prune
almost nothing; a λ0 between conv2's and fc1's can prune at most conv2 (5.8% of the weights);
one above fc1's can prune most of the model.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from fedcomm.config import read_yaml_mapping, validate_params
from fedcomm.simulation.data import FederatedTensors
from fedcomm.stages.partition import draw_partition, load_data
from fedcomm.stages.train import train_in_memory

PROFILE = Path(__file__).resolve().parents[1] / "fedsparse_cifar10.yaml"
RUN = "fedsparse_low"


def _params(raw: dict[str, Any], rounds: int, lambda0: float) -> Any:
    train = {**raw["train"], "rounds": rounds, "eval_every": rounds, "local_eval_every": rounds}
    train["device"] = "cpu"
    algorithms = {**raw["algorithms"], RUN: {**raw["algorithms"][RUN], "lambda0": lambda0}}
    root = os.environ.get("FEDCOMM_DATA_ROOT", "../shared/data")
    data = {**raw["data"], "root": root}
    return validate_params({**raw, "data": data, "train": train, "algorithms": algorithms})


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    rounds, seed, lambdas = int(argv[0]), int(argv[1]), [float(x) for x in argv[2:]]
    raw = read_yaml_mapping(PROFILE)
    first = _params(raw, rounds, lambdas[0])
    dataset = load_data(first)
    part = draw_partition(first, dataset)
    data = FederatedTensors.build(dataset, part.train, part.test)
    for lambda0 in lambdas:
        row = train_in_memory(_params(raw, rounds, lambda0), RUN, seed, data).state.round_rows[-1]
        out = {"lambda0": lambda0, "rounds": rounds, "seed": seed}
        out |= {"sparsity": row["model/sparsity"], "global_accuracy": row["global/accuracy"]}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
