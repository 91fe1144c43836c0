"""Memory and time of evaluation at FedDST's scale (issue 27, part 2).

Workload: the ``feddst_cifar10`` reproduction profile (400 LotteryFL clients, 2 classes x 20
images each, every client testing on 1,000 images of each class it holds; FedDST's CNN; 20
clients a round, 10 local epochs, batch 32; FedDST S = 0.8), run ``feddst`` only. Data: the
CIFAR-10 JPEG copy through ``image_folder`` (``--data image_folder``, under the data root) or
random tensors of CIFAR-10's shape, 60,000 x 3x32x32, 6,000 per class (``--data synthetic``).

    python benchmarks/eval_scale.py validate [--clients 400] [--data synthetic]
    python benchmarks/eval_scale.py rounds [--clients 400] [--rounds 3] [--data synthetic]

``validate`` runs what ``fedcomm config validate`` runs (``stages.train.check_experiment``: load the
data, draw the partition in memory, build the client tensors, check the run). ``rounds`` builds
the same and trains ``--rounds`` rounds twice in the same process, interleaved per repeat: with
global and local evaluation every round (``eval`` rows), and with neither (``train`` rows:
``eval_every`` and ``local_eval_every`` past the run, so only its last round evaluates; that
round is left out). Round times come from the loop's ``time/round_s``; the evaluation inside them
from timing wrappers around the loop's global and local evaluation. Peak RSS is ``getrusage``
(the whole process: data, tensors, training). One process per invocation, so each peak is its
own. The code measured is the ``fedcomm`` on ``PYTHONPATH`` (e.g. an older checkout's ``src``):
before issue 27 the loop had no ``local_eval_every`` and evaluated every upload.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np

from fedcomm.comm.codecs import build_compressor
from fedcomm.config import load_params, validate_params
from fedcomm.data.types import Dataset
from fedcomm.simulation import local_eval, loop
from fedcomm.simulation.data import FederatedTensors
from fedcomm.stages import partition, train

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "pipeline" / "reproductions" / "feddst_cifar10.yaml"


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: KiB -> GB (1e9 B)


def params_for(args: argparse.Namespace, eval_every: int, local_eval_every: int) -> Any:
    raw = load_params(PROFILE).model_dump(mode="json")
    raw["experiment"]["runs"] = ["feddst"]
    raw["partition"]["num_partitions"] = args.clients
    raw["train"].update(rounds=args.rounds, eval_every=eval_every, backend=args.backend)
    if "local_eval_every" in raw["train"]:  # the code under test has the key
        raw["train"]["local_eval_every"] = local_eval_every
    if args.data == "image_folder":
        raw["data"]["dataset"] = {"name": "image_folder", "path": "cifar10_jpeg"}
        raw["data"]["root"] = args.data_root
    return validate_params(raw)


def synthetic(seed: int) -> Dataset:
    """Random tensors of CIFAR-10's shape and class sizes (train + test pooled)."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(10), 6000)
    x = rng.random((len(y), 3, 32, 32), dtype=np.float32)  # (60000, 3, 32, 32) in [0, 1)
    return Dataset("cifar10", x, y, 10)


class EvalClock:
    """Seconds in the loop's global and local evaluation (old code: both via loop.evaluate)."""

    def __init__(self) -> None:
        self.global_s = self.local_s = 0.0
        self.global_x: Any = None

    def wrap(self, inner: Any, kind: str | None) -> Any:
        def timed(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            out = inner(*a, **kw)
            dt = time.perf_counter() - t0
            is_global = kind == "global" or (kind is None and a[2] is self.global_x)
            if is_global:
                self.global_s += dt
            else:
                self.local_s += dt
            return out

        return timed


def rounds(args: argparse.Namespace, dataset: Dataset) -> dict[str, Any]:
    seed = 0
    t0 = time.perf_counter()
    params = params_for(args, 1, 1)
    part = partition.draw_partition(params, dataset)
    data = FederatedTensors.build(dataset, part.train, part.test)
    build_s = time.perf_counter() - t0
    sizes = [len(t) for t in part.test]
    out: dict[str, Any] = {
        "clients": args.clients,
        "test_rows": int(sum(sizes)),
        "distinct_test_rows": len(np.unique(np.concatenate(part.test))),
        "global_test_rows_held": data.global_test.num_examples,
        "build_s": build_s,
        "peak_gb_after_build": peak_gb(),
        "runs": [],
    }
    never = 10**6
    for repeat in range(args.repeats):
        for label, every in (("eval", 1), ("train", never)):
            if label not in args.variants:
                continue
            p = params_for(args, every, every)
            model, algorithm = train.check_run(p, "feddst", seed, data)
            cfg = train.loop_config(p, seed, "feddst")
            clock = EvalClock()
            clock.global_x = data.global_test.x
            patches = [patch.object(local_eval, "evaluate", clock.wrap(local_eval.evaluate, None))]
            if hasattr(loop, "evaluate_global"):
                patches.append(
                    patch.object(
                        loop, "evaluate_global", clock.wrap(loop.evaluate_global, "global")
                    )
                )
            per_round: list[dict[str, float]] = []

            def progress(
                r: int, m: Any, clock: EvalClock = clock, rows: list[Any] = per_round
            ) -> None:
                rows.append(
                    {"round": r, "round_s": m["time/round_s"], "global_eval_s": clock.global_s,
                     "local_eval_s": clock.local_s, "client_s": m["time/client_s"]}
                )  # fmt: skip
                clock.global_s = clock.local_s = 0.0
                print(json.dumps(rows[-1]), flush=True)

            with patch.object(sys, "argv", sys.argv[:1]):
                for p_ in patches:
                    p_.start()
                try:
                    res = loop.run(
                        cfg, algorithm, model, data, build_compressor("none"),
                        config_hash="bench", progress=progress,
                    )  # fmt: skip
                finally:
                    for p_ in patches:
                        p_.stop()
            if label == "train":
                per_round = per_round[:-1]  # the last round always evaluates
            acc = res.state.round_rows[-1].get("global/accuracy")
            out["runs"].append({"repeat": repeat, "label": label, "rounds": per_round,
                                "backend": res.backend, "final_accuracy": acc})  # fmt: skip
            print(label, repeat, json.dumps(per_round), flush=True)
    out["peak_gb"] = peak_gb()
    for label in args.variants:
        rs = [r for run in out["runs"] if run["label"] == label for r in run["rounds"]]
        if not rs:
            continue
        out[f"median_round_s_{label}"] = statistics.median(r["round_s"] for r in rs)
        if label == "eval":
            out["median_global_eval_s"] = statistics.median(r["global_eval_s"] for r in rs)
            out["median_local_eval_s"] = statistics.median(r["local_eval_s"] for r in rs)
            out["median_train_part_s"] = statistics.median(  # the round less its evaluation
                r["round_s"] - r["global_eval_s"] - r["local_eval_s"] for r in rs
            )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phase", choices=["validate", "rounds"])
    ap.add_argument("--clients", type=int, default=400)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--backend", default="sequential", choices=["sequential", "vectorized"])
    ap.add_argument("--variants", nargs="+", default=["eval", "train"], choices=["eval", "train"])
    ap.add_argument("--data", default="synthetic", choices=["synthetic", "image_folder"])
    ap.add_argument("--data-root", default=str(REPO.parent / "shared" / "data"))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    dataset = synthetic(0) if args.data == "synthetic" else None
    load = partition.load_data if dataset is None else (lambda p: dataset)
    with patch.object(train, "load_data", load):
        if args.phase == "validate":
            clients = train.check_experiment(params_for(args, 1, 1))
            result: dict[str, Any] = {"clients": clients}
        else:
            loaded = partition.load_data(params_for(args, 1, 1))
            result = rounds(args, loaded)
    result.update(phase=args.phase, data=args.data, total_s=time.perf_counter() - t0)
    result["peak_gb"] = peak_gb()
    result["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
