"""The evaluate stage: the summaries of a finished run and its saved model's evaluation on every
client (``runs/<run>-s<seed>/summary.json``, its headline numbers in ``metrics.json`` (the DVC
metrics), ``eval_clients.parquet`` and ``plots/``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from fedcomm import atomic, run_files
from fedcomm.algorithms.core import split_members
from fedcomm.comm import bits
from fedcomm.config import Params
from fedcomm.evaluation.headline import run_headline
from fedcomm.evaluation.rebuild import trained_structure
from fedcomm.evaluation.round_time import LinkModel
from fedcomm.evaluation.sim_time import has_energy
from fedcomm.evaluation.summaries import summarize_run
from fedcomm.evaluation.traffic import upload_ratios
from fedcomm.models.progressive import dense_numel
from fedcomm.reporting.plots import (
    plot_accuracy_vs_energy,
    plot_accuracy_vs_gib,
    plot_accuracy_vs_gib_and_sim_time,
    plot_accuracy_vs_round,
)
from fedcomm.simulation.device import resolve as resolve_device
from fedcomm.simulation.global_eval import evaluate_global
from fedcomm.stages.identity import resolved_run_config, run_name
from fedcomm.stages.partition import load_federated
from fedcomm.stages.paths import Paths
from fedcomm.stages.train import build_run_model
from fedcomm.tracking import mlflow as tracking


def evaluate_stage(params: Params, run: str, seed: int, paths: Paths = Paths()) -> dict[str, Any]:
    """Summaries of a finished run plus the saved model's per-client evaluation.

    Writes ``runs/<name>/summary.json`` (final, best, at_budget, at_upload_cap, to_target, time,
    upload, comm, saved_model), ``runs/<name>/metrics.json`` (its headline numbers,
    :mod:`fedcomm.evaluation.headline`: what ``dvc metrics show`` lists) and
    ``runs/<name>/eval_clients.parquet`` (the final global model on each client's test split),
    and logs the headline numbers and the summary to the run's MLflow run. Returns the summary.
    """
    out = paths.run_dir(run, seed)
    remedy = run_files.train_remedy(run, seed)
    folder = paths.train_dir(run, seed)
    trained = run_files.read_trained(folder, remedy)  # every file checked before any work
    dev = resolve_device(params.train.device)  # the saved model is evaluated there too
    tr = None  # the run's MLflow run, checked (store readable, run present) before any work
    if params.tracking.enabled and trained.info.get("mlflow_run_id"):
        tr = tracking.reopen(params.tracking.uri, trained.info["mlflow_run_id"])
    data, phash = load_federated(params, paths)
    config = resolved_run_config(params, run, seed, phash)
    run_files.check_config(trained.info, config, folder / "run.json", remedy)
    rounds, ledger = trained.rounds, trained.ledger
    ev = params.evaluate
    server_s = rounds["time/server_s"] if "time/server_s" in rounds.columns else None
    summary = summarize_run(
        rounds,
        ledger,
        trained.clients,
        server_s=server_s,
        budgets_gib=ev.budgets_gib,
        upload_caps_gib=ev.upload_caps_gib,
        upload_cap_axis=ev.upload_cap_axis,
        targets=ev.targets,
        link=LinkModel(ev.link.down_mbps, ev.link.up_mbps),
        target_metric=ev.metric,
        time_budgets_h=ev.time_budgets_h,
        last_k=ev.last_k,
    )
    # in the saved model's structure (e.g. ProgFed's progressive net)
    model = trained_structure(build_run_model(params, data, seed), params.algorithm(run), seed)
    model_file = folder / "model.safetensors"
    members = split_members(trained.model)  # an ensemble (fedavg_mog) is evaluated as one
    run_files.check_fits(members, model, model_file, remedy)
    numel = dense_numel(model)
    summary["upload"] = upload_summary(ledger, bits.dense(numel))
    summary["comm"] = comm_summary(
        ledger, bits.dense(numel), params.train.rounds, params.train.clients_per_round
    )
    model, data = model.to(dev), data.to(dev)
    members = [{k: v.to(dev) for k, v in m.items()} for m in members]
    ge = evaluate_global(model, members, data, topk=(params.train.topk,), per_client=True)
    g = ge.union  # each distinct test example once; every client's split gathered from it
    per_client = [{"client_id": c, **_eval_row(r)} for c, r in enumerate(ge.clients)]
    table = pl.DataFrame(per_client, infer_schema_length=None)
    atomic.write_parquet(out / "eval_clients.parquet", table)
    summary["saved_model"] = {
        "global/accuracy": g.accuracy,
        "global/loss": g.loss,
        "topk/accuracy": g.topk.get(params.train.topk),
    }
    headline = run_headline(summary, metric=ev.metric, targets=ev.targets)
    atomic.write_json(out / "summary.json", summary)
    atomic.write_json(out / "metrics.json", headline)
    plots = run_plots(run_name(run, seed), rounds, out / "plots")
    if tr is not None:
        flat = {k: float(v) for k, v in tracking.flatten(summary).items() if _is_float(v)}
        tr.log_metrics({k: float(v) for k, v in headline.items() if v is not None})
        tr.log_metrics({f"summary/{k}": v for k, v in flat.items()})
        tr.log_artifact(out / "eval_clients.parquet")
        tr.log_artifact(out / "summary.json")
        tr.log_artifact(out / "metrics.json")
        for png in plots:
            tr.log_artifact(png, "plots")
    return summary


def upload_summary(ledger: pl.DataFrame, dense_model_bits: int) -> dict[str, float | None]:
    """Mean upload per client per round (one up message), in bytes and decimal KB (FedBIAD's
    Table I/II unit), and ``up_ratio_mean``: the mean over training rounds of the dense model's
    upload over the sent upload (FedDST's ~5x at sparsity 0.8; see
    :func:`~fedcomm.evaluation.traffic.upload_ratios`)."""
    up = ledger.filter(pl.col("direction") == "up")
    if up.height == 0:
        return {"bytes_per_client_round": None, "kb_per_client_round": None, "up_ratio_mean": None}
    sent = (up["payload_bits"] + up["index_bits"] + up["meta_bits"]).mean()
    ratios = upload_ratios(ledger, dense_model_bits)["up_ratio"]
    return {
        "bytes_per_client_round": float(sent) / 8,  # type: ignore[arg-type]
        "kb_per_client_round": float(sent) / 8 / 1000,  # type: ignore[arg-type]
        "up_ratio_mean": float(ratios.mean()) if len(ratios) else None,  # type: ignore[arg-type]
    }


def comm_summary(
    ledger: pl.DataFrame, dense_model_bits: int, rounds: int, clients_per_round: int
) -> dict[str, float]:
    """Bits sent (warm-up and extra rounds included) against end-to-end dense FedAvg: the dense
    model down and up for each of ``clients_per_round`` clients in each of ``train.rounds``
    rounds. ``cost_vs_dense_e2e`` counts both directions; ``up_cost_vs_dense_e2e`` the uplink
    only, which is what ProgFed's Table 5 cost % measures for compressed runs (only the uplink is
    compressed; the paper scales its float count by b/32 and p)."""
    total = ledger["payload_bits"] + ledger["index_bits"] + ledger["meta_bits"]
    sent = int(total.sum())
    up = int(total.filter(ledger["direction"] == "up").sum())
    one_way = dense_model_bits * clients_per_round * rounds
    nan = float("nan")
    return {
        "total_gib": bits.to_gib(sent),
        "dense_e2e_gib": bits.to_gib(2 * one_way),
        "cost_vs_dense_e2e": sent / (2 * one_way) if one_way else nan,
        "up_cost_vs_dense_e2e": up / one_way if one_way else nan,
    }


def _eval_row(r: Any) -> dict[str, Any]:
    return {"n": r.n, "loss": r.loss, "accuracy": r.accuracy}


def _is_float(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return v not in ("True", "False")


def run_plots(name: str, rounds: pl.DataFrame, out: Path) -> list[Path]:
    """This run's curves: global and local accuracy vs cumulative GiB, global accuracy vs round,
    with a ``system`` section global accuracy vs GiB beside simulated hours, and with
    ``system.energy`` global accuracy vs the clients' cumulative energy."""
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
    if has_energy(rounds):  # system.energy: the clients' joules too
        paths.append(out / "accuracy_vs_energy.png")
        plot_accuracy_vs_energy(runs, paths[-1], title=f"{name}: global accuracy vs energy")
    return paths
