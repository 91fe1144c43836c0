"""Recompute the committed reproduction curves' first evaluation: does a change move a number?

    python pipeline/recompute_curves.py record OUT.json [--src DIR] [--only NAME ...]
    python pipeline/recompute_curves.py compare BEFORE.json AFTER.json

``record``: for every build family with committed curves and their params file
(``docs/reproductions/data/<build>_s<seed>.csv`` beside ``<build>_s<seed>.yaml``; the lowest
seed of each family), every run of the params file's experiment is trained exactly as the train
stage trains it (the same params, seed, partition, model init, algorithm, compressor and loop
config: the pieces of ``fedcomm.stages.train.train_in_memory``), in memory, and stopped after the
round of its first row in the committed curves (its first evaluation). OUT.json gets each
round's metrics up to there (wall-clock ``time/*`` left out; simulated ``time/sim_*`` kept: the
bits each way, the training loss, densities, the algorithm's metrics, the accuracies), and how
the first evaluation compares with the committed row: ``match`` when every column the committed
curves have equals the recomputed value to the bit, else the columns that differ. (A family
built with older code may differ from the code of today; ``compare`` is the refactor's check.)

``--src DIR`` imports the library from ``DIR`` (``src/`` of another checkout, say a worktree of
the commit before a refactor) instead of this project's; this script only uses what every
version since the per-seed builds has (``load_params``, the partition and train stages'
functions, ``loop.run``). ``--only`` keeps the families whose build name contains one of the
strings.

``compare``: two recordings (before and after a change) compared family by family, run by run,
round by round, bit for bit (JSON floats round-trip exactly). Exit status 1 on any difference
or on a family or run only one of them has.

Needs the datasets (``FEDCOMM_DATA_ROOT``). Costs each run's first evaluation rounds: ~15-20 CPU
minutes for every family (the CIFAR-10 Table 1 family's 7 runs x 10 rounds are half of it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "docs" / "reproductions" / "data"
SEEDED = re.compile(r"^(?P<build>.+)_s(?P<seed>[0-9]+)$")


class _Stop(Exception):
    """Raised by the progress callback once the round to check is done."""


def families(only: list[str]) -> dict[str, tuple[int, Path, Path]]:
    """Build name -> (lowest seed, its params file, its curves) for every family with both."""
    seeds: dict[str, list[int]] = defaultdict(list)
    for params in DATA.glob("*.yaml"):
        m = SEEDED.match(params.stem)
        if m and params.with_suffix(".csv").is_file():
            seeds[m["build"]].append(int(m["seed"]))
    out = {}
    for build, found in sorted(seeds.items()):
        if only and not any(s in build for s in only):
            continue
        seed = min(found)
        stem = DATA / f"{build}_s{seed}"
        out[build] = (seed, stem.with_suffix(".yaml"), stem.with_suffix(".csv"))
    return out


def _value(v: Any) -> float | None:
    """A metric as JSON: None for a missing or NaN value."""
    if v is None:
        return None
    f = float(v)
    return None if math.isnan(f) else f


def record_family(seed: int, params_file: Path, curves_file: Path) -> dict[str, Any]:
    import polars as pl

    from fedcomm.config import load_params
    from fedcomm.simulation import loop
    from fedcomm.stages.partition import load_federated, partition_stage
    from fedcomm.stages.paths import Paths
    from fedcomm.stages.train import check_run, loop_config, run_compressor

    params = load_params(params_file)
    curves = pl.read_csv(curves_file, infer_schema_length=None)
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        paths = Paths(partition=Path(tmp) / "partition")
        partition_stage(params, paths)
        data, _ = load_federated(params, paths)
        for run in params.experiment.runs:
            committed = curves.filter((pl.col("run") == run) & (pl.col("seed") == seed))
            if committed.is_empty():
                out[run] = {"error": "no committed curve for this run and seed"}
                continue
            first = committed.sort("round").row(0, named=True)
            stop_at = int(first["round"])
            model, algorithm = check_run(params, run, seed, data)
            lcfg = loop_config(params, seed, run)
            rows: list[dict[str, Any]] = []

            def progress(
                round_: int, metrics: Any, rows: list[dict[str, Any]] = rows, stop: int = stop_at
            ) -> None:
                rows.append({"round": round_, **dict(metrics)})
                if round_ >= stop:
                    raise _Stop

            t0 = time.perf_counter()
            comp = run_compressor(params, run)
            with contextlib.suppress(_Stop):
                loop.run(lcfg, algorithm, model, data, comp, config_hash="recompute",
                         progress=progress)  # fmt: skip
            kept = [
                {k: _value(v) for k, v in r.items() if not k.startswith("time/") or "sim_" in k}
                for r in rows
            ]
            out[run] = {
                "rounds": kept,
                "seconds": round(time.perf_counter() - t0, 1),
                "committed": _against(first, kept[-1]),
            }
    return out


def _against(first: dict[str, Any], last: dict[str, Any]) -> str | list[str]:
    """``match``, or the committed columns whose value the recomputed round does not have."""
    differ = []
    for column, want in first.items():
        wall = column.startswith("time_") and "sim" not in column
        if column in ("run", "seed", "round") or wall:
            continue
        metric = next((k for k in last if k.replace("/", "_") == column), None)
        got = last.get(metric) if metric else None
        w = None if want is None or (isinstance(want, float) and math.isnan(want)) else want
        if (w is None) != (got is None) or (w is not None and float(w) != got):
            differ.append(f"{column}: committed {w!r}, recomputed {got!r}")
    return differ or "match"


def record(out: Path, src: Path | None, only: list[str]) -> int:
    if src is not None:
        sys.path.insert(0, str(src.resolve()))
    import fedcomm

    found = families(only)
    result: dict[str, Any] = {"library": str(Path(fedcomm.__file__).parent), "families": {}}
    for build, (seed, params_file, curves_file) in found.items():
        t0 = time.perf_counter()
        result["families"][build] = {
            "seed": seed,
            "runs": record_family(seed, params_file, curves_file),
        }
        runs = result["families"][build]["runs"]
        verdicts = {r: v.get("committed", v.get("error")) for r, v in runs.items()}
        print(f"{build} (seed {seed}, {time.perf_counter() - t0:.0f} s): "
              + ", ".join(f"{r}: {'match' if v == 'match' else 'differs'}"
                          for r, v in verdicts.items()), flush=True)  # fmt: skip
        out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")  # after each family
    return 0


def compare(before: Path, after: Path) -> int:
    a, b = (json.loads(p.read_text())["families"] for p in (before, after))
    bad = 0
    for build in sorted(set(a) | set(b)):
        if build not in a or build not in b:
            print(f"{build}: only in {'after' if build in b else 'before'}")
            bad += 1
            continue
        ra, rb = a[build]["runs"], b[build]["runs"]
        for run in sorted(set(ra) | set(rb)):
            x, y = ra.get(run, {}), rb.get(run, {})
            if "rounds" not in x or x.get("rounds") != y.get("rounds"):
                print(f"{build} {run}: DIFFERS")
                bad += 1
            else:
                print(f"{build} {run}: identical ({len(x['rounds'])} rounds)")
    print(f"{bad} difference(s)")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("out", type=Path)
    rec.add_argument("--src", type=Path, default=None)
    rec.add_argument("--only", nargs="*", default=[])
    cmp_ = sub.add_parser("compare")
    cmp_.add_argument("before", type=Path)
    cmp_.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.cmd == "record":
        return record(args.out, args.src, args.only)
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
