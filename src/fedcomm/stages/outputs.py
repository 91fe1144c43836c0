"""The files a run writes: the train stage's tables, model and ``run.json``, and the evaluate
stage's plots of the run. :mod:`fedcomm.run_files` reads them back."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from fedcomm import atomic
from fedcomm.reporting.plots import (
    plot_accuracy_vs_gib,
    plot_accuracy_vs_gib_and_sim_time,
    plot_accuracy_vs_round,
)
from fedcomm.simulation import loop
from fedcomm.sparse_io import save_sparse


def write_run_outputs(
    out: Path, result: loop.RunResult, config: dict[str, Any], run_id: str | None
) -> Path:
    """``out/``: ``rounds``, ``ledger`` and ``clients`` tables, ``model.safetensors`` and
    ``run.json`` (the MLflow run, the resolved config, the rounds run)."""
    out.mkdir(parents=True, exist_ok=True)
    st = result.state
    atomic.write_parquet(out / "rounds.parquet", rounds_frame(st.round_rows))
    result.ledger.write(out / "ledger.parquet")
    clients = pl.DataFrame(st.client_rows, infer_schema_length=None)
    atomic.write_parquet(out / "clients.parquet", clients)
    save_sparse(result.final_params, out / "model.safetensors")
    atomic.write_json(
        out / "run.json", {"mlflow_run_id": run_id, "config": config, "rounds": st.round_}
    )
    return out


def rounds_frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    frame = pl.DataFrame(rows, infer_schema_length=None)
    casts = [pl.col("round").cast(pl.Int32)] + [
        pl.col(c).cast(pl.Float64) for c in frame.columns if c != "round"
    ]
    return frame.with_columns(casts)


def run_plots(name: str, rounds: pl.DataFrame, out: Path) -> list[Path]:
    """This run's curves: global and local accuracy vs cumulative GiB, global accuracy vs round,
    and with a ``system`` section global accuracy vs GiB beside simulated hours."""
    out.mkdir(parents=True, exist_ok=True)
    runs = {name: [rounds]}
    paths = [
        out / "global_accuracy_vs_gib.png",
        out / "local_accuracy_vs_gib.png",
        out / "accuracy_vs_round.png",
    ]
    plot_accuracy_vs_gib(
        runs, paths[0], metric="global/accuracy", title=f"{name}: global accuracy vs communication"
    )
    plot_accuracy_vs_gib(
        runs, paths[1], metric="local/accuracy", title=f"{name}: local accuracy vs communication"
    )
    plot_accuracy_vs_round(
        runs, paths[2], metric="global/accuracy", title=f"{name}: global accuracy vs round"
    )
    if "time/sim_elapsed_s" in rounds.columns:  # a system section: simulated time too
        paths.append(out / "accuracy_vs_gib_and_sim_time.png")
        plot_accuracy_vs_gib_and_sim_time(
            runs, paths[-1], title=f"{name}: global accuracy vs communication and simulated time"
        )
    return paths
