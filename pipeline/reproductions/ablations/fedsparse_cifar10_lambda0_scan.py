"""FedSparse's λ0 -> sparsity map on the CIFAR-10 Table 1 profile: a one-change scan of λ0.

    FEDCOMM_DATA_ROOT=../shared/data .venv/bin/python \\
        pipeline/reproductions/ablations/fedsparse_cifar10_lambda0_scan.py ROUNDS SEED LAMBDA0... \\
        [--set KEY=VALUE ...]

Runs ``fedsparse_low`` of ``pipeline/reproductions/fedsparse_cifar10.yaml`` (the table run's
partition, model, training and FedSparse defaults) for ROUNDS rounds with only ``lambda0`` changed,
on the CPU, and prints one JSON line per λ0: the sparsity and global accuracy after the last round,
and the share of each layer's weights that are zero (``layers``). ``--set`` changes one of
FedSparse's options for every λ0 of the scan (a reading of the paper, e.g. ``gate_mapping=l0_shift``
or ``data_term=shard_sum``; the value is read as YAML) and is echoed in each line (``set``).

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

import torch
import yaml

from fedcomm.config import read_yaml_mapping, validate_params
from fedcomm.simulation.data import FederatedTensors
from fedcomm.stages.partition import draw_partition, load_data
from fedcomm.stages.train import train_in_memory

PROFILE = Path(__file__).resolve().parents[1] / "fedsparse_cifar10.yaml"
RUN = "fedsparse_low"


def _params(raw: dict[str, Any], rounds: int, lambda0: float, sets: dict[str, Any]) -> Any:
    train = {**raw["train"], "rounds": rounds, "eval_every": rounds, "local_eval_every": rounds}
    train["device"] = "cpu"
    run = {**raw["algorithms"][RUN], **sets, "lambda0": lambda0}
    algorithms = {**raw["algorithms"], RUN: run}
    root = os.environ.get("FEDCOMM_DATA_ROOT", "../shared/data")
    data = {**raw["data"], "root": root}
    return validate_params({**raw, "data": data, "train": train, "algorithms": algorithms})


def _sets(items: list[str]) -> dict[str, Any]:
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise SystemExit(f"error: --set {item!r} is not KEY=VALUE")
        out[key] = yaml.safe_load(value)
    return out


def layer_sparsity(params: dict[str, torch.Tensor]) -> dict[str, float]:
    """The share of zero entries of each weight tensor (``fc1.weight`` -> 0.43)."""
    return {
        name: round(float((t == 0).float().mean()), 5)
        for name, t in params.items()
        if name.endswith("weight")
    }


def main(argv: list[str]) -> int:
    sets_at = [i for i, a in enumerate(argv) if a == "--set"]
    sets = _sets([argv[i + 1] for i in sets_at if i + 1 < len(argv)])
    argv = [a for i, a in enumerate(argv) if i not in sets_at and i - 1 not in sets_at]
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    rounds, seed, lambdas = int(argv[0]), int(argv[1]), [float(x) for x in argv[2:]]
    raw = read_yaml_mapping(PROFILE)
    first = _params(raw, rounds, lambdas[0], sets)
    dataset = load_data(first)
    part = draw_partition(first, dataset)
    data = FederatedTensors.build(dataset, part.train, part.test)
    for lambda0 in lambdas:
        result = train_in_memory(_params(raw, rounds, lambda0, sets), RUN, seed, data)
        row = result.state.round_rows[-1]
        out: dict[str, Any] = {"lambda0": lambda0, "rounds": rounds, "seed": seed}
        if sets:
            out["set"] = sets
        out |= {"sparsity": row["model/sparsity"], "global_accuracy": row["global/accuracy"]}
        out["layers"] = layer_sparsity(result.final_params)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
