"""Hand-made run folders for the simulated-time report tests (issue 30): two runs x two seeds of
six rounds, evaluated at rounds 2, 4 and 6, with or without the ``system`` columns.

Seed 0's simulated rounds last 600, 900, 1200, 600, 1800 and 900 s (elapsed after rounds 2, 4
and 6: 1500, 3300 and 6000 s); seed 1's last twice as long (3000, 6600, 12000 s). ``fedavg``
evaluates 0.30, 0.55, 0.50 (seed 0) and 0.40, 0.60, 0.65 (seed 1); ``fedprox`` 0.05 more.

With ``energy`` (``system.energy``'s columns) seed 0's clients spend 100, 200, 300, 100, 200 and
300 J a round (cumulative after rounds 2, 4 and 6: 300, 600 and 1200 J), a tenth of it by dropped
clients, split 20% download, 50% compute, 30% upload; seed 1's three times as much.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl

from fedcomm.comm.ledger import SCHEMA as LEDGER_SCHEMA
from fedcomm.evaluation.summaries import summarize_run
from fedcomm.stages.paths import Paths

ROUND_S = {0: [600.0, 900.0, 1200.0, 600.0, 1800.0, 900.0]}
ROUND_S[1] = [2 * s for s in ROUND_S[0]]
ACCURACY = {0: [0.30, 0.55, 0.50], 1: [0.40, 0.60, 0.65]}
SHIFT = {"fedavg": 0.0, "fedprox": 0.05}
FINISHED = [8, 7, 6, 8, 5, 7]  # of 10 sampled, 9 online each round
PARTIAL = [1, 0, 2, 0, 1, 0]
ROUND_J = {0: [100.0, 200.0, 300.0, 100.0, 200.0, 300.0]}
ROUND_J[1] = [3 * j for j in ROUND_J[0]]


def rounds_table(run: str, seed: int, *, system: bool, energy: bool = False) -> pl.DataFrame:
    """One seed's rounds table (the columns the train stage writes, ``system`` ones optional,
    ``energy`` ones too)."""
    n = 6
    acc = [None, ACCURACY[seed][0], None, ACCURACY[seed][1], None, ACCURACY[seed][2]]
    acc = [None if a is None else a + SHIFT[run] for a in acc]
    up = [1000.0 * (r + 1) * (1.0 + seed) for r in range(n)]
    down = [4000.0] * n
    cum = [sum(up[: i + 1]) + sum(down[: i + 1]) for i in range(n)]
    data: dict[str, Any] = {
        "round": list(range(1, n + 1)),
        "global/accuracy": acc,
        "local/accuracy": [None if a is None else a - 0.1 for a in acc],
        "global/loss": [None if a is None else 2.0 - a for a in acc],
        "model/sparsity": [0.0] * n,
        "comm/up_bytes": up,
        "comm/down_bytes": down,
        "comm/cum_bytes": cum,
        "comm/cum_gib": [c / 2**30 for c in cum],
        "time/round_s": [0.5 + 0.1 * r for r in range(n)],
    }
    if system:
        round_s = ROUND_S[seed]
        data |= {
            "time/sim_round_s": round_s,
            "time/sim_elapsed_s": [sum(round_s[: i + 1]) for i in range(n)],
            "system/sampled": [10.0] * n,
            "system/online": [9.0] * n,
            "system/finished": [float(f) for f in FINISHED],
            "system/dropped": [10.0 - f for f in FINISHED],
            "system/partial": [float(p) for p in PARTIAL],
        }
    if energy:
        joules = ROUND_J[seed]
        data |= {
            "energy/round_j": joules,
            "energy/down_j": [0.2 * j for j in joules],
            "energy/compute_j": [0.5 * j for j in joules],
            "energy/up_j": [0.3 * j for j in joules],
            "energy/dropped_j": [0.1 * j for j in joules],
            "energy/cum_j": [sum(joules[: i + 1]) for i in range(n)],
        }
    frame = pl.DataFrame(data)
    return frame.with_columns(pl.col("round").cast(pl.Int32), pl.exclude("round").cast(pl.Float64))


def write_runs(
    paths: Paths,
    runs: list[str],
    seeds: list[int],
    *,
    system: bool,
    energy: bool = False,
    **options: Any,
) -> None:
    """Each run and seed's ``train/rounds.parquet`` and the evaluate stage's ``summary.json``
    (:func:`summarize_run` of those rounds with ``options``: budgets, targets...)."""
    ledger = pl.DataFrame(schema=LEDGER_SCHEMA)
    clients = pl.DataFrame(schema={"round": pl.Int32, "client_id": pl.Int32, "train_s": pl.Float64})
    for run in runs:
        for seed in seeds:
            rounds = rounds_table(run, seed, system=system, energy=energy)
            train = paths.train_dir(run, seed)
            train.mkdir(parents=True, exist_ok=True)
            rounds.write_parquet(train / "rounds.parquet")
            summary = summarize_run(rounds, ledger, clients, **options)
            (paths.run_dir(run, seed) / "summary.json").write_text(json.dumps(summary))


def report_line(text: str, start: str) -> str:
    """The first line of a markdown report that starts with ``start``."""
    return next(line for line in text.splitlines() if line.startswith(start))


def curve_column(reports: Path, run: str, seed: int, column: str) -> list[float]:
    """``column`` of ``reports/curves.csv`` for one run and seed, in round order."""
    curves = pl.read_csv(reports / "curves.csv")
    return curves.filter((pl.col("run") == run) & (pl.col("seed") == seed))[column].to_list()


def tree(root: Path) -> list[str]:
    """The files under ``root``, relative and sorted."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
