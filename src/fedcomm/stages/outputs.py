"""The files a run's training writes: its tables, model and ``run.json``
(:mod:`fedcomm.run_files` reads them back). The run's plots are the evaluate stage's
(:func:`fedcomm.stages.evaluate.run_plots`), so training imports no plotting library."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from fedcomm import atomic
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
