"""One simulation on 1 and on N processes (``torchrun``, :mod:`fedcomm.simulation.shard`).

For each workload of ``benchmarks/backends.py`` asked for (W1: the MNIST MLP, 100 clients a round,
vectorized; W3: FedSparse's CIFAR-10 LeNet-5, 10 clients a round of 500 images, sequential: the
backend ``auto`` picks on a CPU), FedAvg runs ``--rounds`` rounds on 1 process, then on each
``--nproc`` through torch's elastic launcher (gloo, host bytes, on any device), every
process with ``--threads`` intra-op threads. Rank 0 times each round (it evaluates the global
model every round, as the workloads do); every rank counts what its gathers carried. Reported per
(workload, processes): s/round (median of the rounds after the first), the speed-up over one
process, the bytes each rank received per round and the seconds rank 0 spent in gathers
(waiting for the slowest rank included), and whether the final model equals the one-process
run's bit for bit (sequential) or to float tolerance (vectorized). One process's round is also
split into its parts (client work, server step, the rest: evaluation, encoding, bookkeeping), the
inputs of the projection in ``docs/speed.md``.

    python benchmarks/sharding.py [--workloads W1 W3] [--nproc 2] [--rounds 10] [--threads 1]
                                  [--device cpu] [--synthetic] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import torch

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.data.datasets.verify import DATA_ROOT_ENV
from fedcomm.simulation import device, loop, shard

sys.path.insert(0, str(Path(__file__).resolve().parent))  # backends.py, beside this file
import backends

BACKEND = {"W1": "vectorized", "W2": "sequential", "W3": "sequential"}  # auto's choice on a CPU


def one_run(name: str, rounds: int, seed: int, dev: str, out: Path, synthetic: bool) -> None:
    """This process's part of a run (any world size); rank 0 (or the only process) writes
    ``out`` (a torch file: per-round seconds and metrics, the final model, the traffic)."""
    sharded = shard.start(device.resolve(dev))
    wl = backends.WORKLOADS[name]
    root = "" if synthetic else os.environ.get(DATA_ROOT_ENV, "")
    if synthetic:  # random tensors of the workload's shapes (backends' fallback for CIFAR-10)
        wl = dataclasses.replace(wl, dataset="synthetic")
    data, model, source = backends.start_up(wl, root, seed)
    local = LocalConfig(epochs=1, batch_size=wl.batch, lr=wl.lr)
    cfg = loop.LoopConfig(
        rounds, wl.per_round, local, seed, eval_every=1, backend=BACKEND[name], device=dev
    )
    algorithm = build_algorithm(CONFIGS["fedavg"]().with_rounds(rounds))
    stamps: list[float] = []
    t0 = time.perf_counter()

    def tick(r: int, m: Any) -> None:
        device.synchronize(device.resolve(dev))
        stamps.append(time.perf_counter())

    result = loop.run(
        cfg, algorithm, model, data, build_compressor("none"), config_hash="bench",
        progress=tick, sharded=sharded,
    )  # fmt: skip
    if sharded is None or sharded.writes:
        round_s = [b - a for a, b in zip([t0, *stamps[:-1]], stamps, strict=True)]
        traffic = vars(sharded.traffic) if sharded is not None else {}
        torch.save(
            {"round_s": round_s, "rows": result.state.round_rows, "source": source,
             "final": {k: v.cpu() for k, v in result.final_params.items()},
             "backend": result.backend, "traffic": traffic},
            out,
        )  # fmt: skip
    if sharded is not None and not sharded.writes:  # every rank's received bytes
        torch.save(vars(sharded.traffic), out.with_suffix(f".rank{sharded.rank}"))
    shard.finish(sharded)


def launch(name: str, nproc: int, args: argparse.Namespace, out: Path) -> float:
    """The run on ``nproc`` processes (1: this process's child, no launcher); wall seconds."""
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    worker = [__file__, "--worker", name, "--rounds", str(args.rounds), "--seed", str(args.seed),
              "--device", args.device, "--out", str(out)]  # fmt: skip
    if args.synthetic:
        worker.append("--synthetic")
    env = {"OMP_NUM_THREADS": str(args.threads)}
    os.environ.update(env)
    t0 = time.perf_counter()
    if nproc == 1:
        import subprocess

        subprocess.run([sys.executable, *worker], check=True)
    else:
        config = LaunchConfig(
            min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
            rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
        )  # fmt: skip
        elastic_launch(config, sys.executable)(*worker)
    return time.perf_counter() - t0


def steady(round_s: list[float]) -> float:
    return statistics.median(round_s[1:] if len(round_s) > 1 else round_s)


def parts(rows: list[dict[str, Any]], per_round: int) -> dict[str, float]:
    """One process's round split: client work (sum over the cohort), server step, the rest."""
    tail = rows[1:] if len(rows) > 1 else rows
    clients = statistics.median(float(r["time/client_s"]) * per_round for r in tail)
    server = statistics.median(float(r["time/server_s"]) for r in tail)
    total = statistics.median(float(r["time/round_s"]) for r in tail)
    return {"clients_s": clients, "server_s": server, "rest_s": max(0.0, total - clients - server)}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> str:
    if all(torch.equal(a[k], b[k]) for k in a):
        return "bit-identical"
    close = all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5) for k in a)
    return "within 1e-4" if close else "DIFFERENT"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=["W1", "W3"], choices=list(BACKEND))
    p.add_argument("--nproc", nargs="+", type=int, default=[2])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--threads", type=int, default=1, help="intra-op threads a process")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--synthetic", action="store_true", help="random tensors of the workloads' shapes"
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        torch.set_num_threads(args.threads)
        one_run(args.worker, args.rounds, args.seed, args.device, args.out, args.synthetic)
        return
    report: dict[str, Any] = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "torch": torch.__version__, "device": args.device},
        "rounds": args.rounds, "threads_per_process": args.threads, "workloads": {},
    }  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.workloads:
            runs: dict[str, Any] = {}
            base: dict[str, Any] | None = None
            for n in [1, *args.nproc]:
                out = Path(tmp) / f"{name}-{n}.pt"
                wall = launch(name, n, args, out)
                res = torch.load(out, weights_only=False)
                s = steady(res["round_s"])
                entry: dict[str, Any] = {
                    "s_per_round": s, "wall_s": wall, "backend": res["backend"],
                    "data": res["source"],
                }  # fmt: skip
                if base is None:
                    base = res
                    entry["parts"] = parts(res["rows"], backends.WORKLOADS[name].per_round)
                else:
                    t = res["traffic"]
                    entry |= {
                        "speedup": runs["1"]["s_per_round"] / s,
                        "gather_bytes_in_per_round_rank0": t["bytes_in"] / args.rounds,
                        "gather_s_per_round_rank0": t["seconds"] / args.rounds,
                        "final_model": same(base["final"], res["final"]),
                        "final_accuracy_equal": res["rows"][-1]["global/accuracy"]
                        == base["rows"][-1]["global/accuracy"],
                    }
                runs[str(n)] = entry
                print(f"{name} x{n}: {s:.3f} s/round  {json.dumps(entry, default=str)}", flush=True)
            report["workloads"][name] = runs
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
