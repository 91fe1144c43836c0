"""The pipeline's stages as library calls: partition -> train -> evaluate -> summarize.

Each function takes the validated :class:`~fedcomm.config.Params` and explicit paths, does one
stage's work and writes its declared outputs atomically. The DVC entry scripts in ``stages/``
and the ``fedcomm`` CLI both call these, so there is exactly one implementation.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl
import torch

from fedcomm import __version__, atomic, run_files
from fedcomm.algorithms import build_algorithm
from fedcomm.algorithms.base import split_members
from fedcomm.comm import bits
from fedcomm.comm.codecs import build_compressor
from fedcomm.config import ConfigError, Params, keyed, model_options
from fedcomm.data.datasets import load_dataset, resolve_root
from fedcomm.data.federated import Partition, PartitionSpec, make_partition, partition_hash
from fedcomm.data.partition_files import partition_is_current, read_partition, write_partition
from fedcomm.data.partitioners import PartitionError
from fedcomm.data.types import Dataset
from fedcomm.evaluation.summaries import LinkModel, summarize_run, upload_ratios
from fedcomm.models import build_model
from fedcomm.models.progressive import dense_numel
from fedcomm.reporting.plots import (
    plot_accuracy_vs_gib,
    plot_accuracy_vs_gib_and_sim_time,
    plot_accuracy_vs_round,
)
from fedcomm.seeding import Stream, torch_generator
from fedcomm.simulation import checkpoint as ckpt_mod
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors
from fedcomm.simulation.device import resolve as resolve_device
from fedcomm.simulation.global_eval import evaluate_global
from fedcomm.simulation.progress import round_progress
from fedcomm.sparse_io import save_sparse
from fedcomm.tracking import mlflow as tracking
from fedcomm.tracking.inputs import partition_input


@dataclass(frozen=True)
class Paths:
    """Where the stages read and write, relative to the working directory by default."""

    partition: Path = Path("data/partition")
    runs: Path = Path("runs")
    reports: Path = Path("reports")
    checkpoints: Path = Path(".fedcomm/checkpoints")

    def run_dir(self, run: str, seed: int) -> Path:
        return self.runs / run_name(run, seed)

    def train_dir(self, run: str, seed: int) -> Path:
        """The train stage's output directory (the evaluate stage writes beside it)."""
        return self.run_dir(run, seed) / "train"


def run_name(run: str, seed: int) -> str:
    return f"{run}-s{seed}"


RoundCallback = Callable[[int, Mapping[str, float | None]], None]


class StopRun(Exception):
    """Raised by a round callback to end a run early (e.g. a sweep pruning a trial): the run's
    MLflow run is marked KILLED with the reason as tag ``fedcomm.stopped``; no outputs are
    written and the checkpoint is kept."""


# --- partition ---------------------------------------------------------------------------------


def partition_spec(params: Params) -> PartitionSpec:
    cfg = params.partition
    fields = cfg.model_dump(exclude={"kind", "num_partitions", "test_fraction", "seed"})
    return PartitionSpec(cfg.kind, cfg.num_partitions, fields, cfg.test_fraction, cfg.seed)


def load_data(params: Params) -> Dataset:
    return load_dataset(params.data.dataset.name, params.data.root, **params.data.options())


def partition_stage(params: Params, paths: Paths = Paths()) -> str:
    """Partition the dataset over clients; returns the partition hash. Skips if current."""
    dataset = load_data(params)
    spec = partition_spec(params)
    expected = partition_hash(dataset.fingerprint(), spec)
    if not partition_is_current(paths.partition, expected):
        write_partition(draw_partition(params, dataset), dataset, paths.partition, spec)
    return expected


def draw_partition(params: Params, dataset: Dataset) -> Partition:
    """``make_partition`` for ``params.partition``; an error that starts with one of its keys
    ("num_partitions must be ...") names the full key (``partition.num_partitions: must be``)."""
    try:
        return make_partition(dataset, partition_spec(params))
    except PartitionError as err:
        named = keyed(str(err), ["partition"], type(params.partition).model_fields)
        if named is not None:
            raise PartitionError(named) from None
        raise


# --- train -------------------------------------------------------------------------------------


def _git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _git_dirty() -> str:
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return "true" if out.stdout.strip() else "false"


def resolved_run_config(params: Params, run: str, seed: int, phash: str) -> dict[str, Any]:
    """Everything that determines a training run's numbers (its identity and MLflow params)."""
    return {
        "run": run,
        "seed": seed,
        "algorithm": params.algorithm(run).model_dump(mode="json"),
        # (where the files are and whether they are checked do not change the numbers)
        "data": params.data.model_dump(mode="json", exclude={"root": True, "dataset": {"verify"}}),
        "partition": params.partition.model_dump(mode="json"),
        "partition_hash": phash,
        "model": params.model.model_dump(mode="json"),
        "train": params.train.model_dump(mode="json"),
    }


RUN_ID_FILE = "mlflow_run_id"  # beside a run's checkpoint: the MLflow run training it


def config_hash(config: Mapping[str, Any]) -> str:
    blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def load_federated(params: Params, paths: Paths) -> tuple[FederatedTensors, str]:
    """The client tensors of the current partition; refuses a stale partition."""
    dataset = load_data(params)
    expected = partition_hash(dataset.fingerprint(), partition_spec(params))
    part = read_partition(paths.partition, expected_hash=expected)
    return FederatedTensors.build(dataset, part.train, part.test), expected


def build_run_model(params: Params, data: FederatedTensors, seed: int) -> torch.nn.Module:
    """The model, initialised from the ``(seed, INIT)`` stream."""
    gen = torch_generator(seed, Stream.INIT)
    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen, device=gen.device)))
    return build_model(
        params.model.name,
        input_shape=data.input_shape,
        num_classes=data.num_classes,
        **model_options(params.model),
    )


def train_stage(
    params: Params,
    run: str,
    seed: int,
    paths: Paths = Paths(),
    *,
    resume: bool = True,
    show_progress: bool | None = None,
    parent_run_id: str | None = None,
    tags: Mapping[str, str] | None = None,
    on_round: RoundCallback | None = None,
    on_open: Callable[[str], None] | None = None,
    mlflow_run_name: str | None = None,
) -> Path:
    """Train one (algorithm run, seed); writes ``runs/<run>-s<seed>/train/``. Resumes if possible.

    Everything that can fail on bad input (the partition, the model on the data, the algorithm)
    is built and checked *before* an MLflow run is opened, so a bad configuration leaves no run.
    ``parent_run_id`` nests the MLflow run (a sweep trial), ``tags`` are added to it, and
    ``on_round(round, metrics)`` is called after every round (it may raise :class:`StopRun`);
    ``on_open(mlflow_run_id)`` once the MLflow run exists (before round 1);
    ``mlflow_run_name`` replaces ``<run>-s<seed>`` as the MLflow run's name.
    """
    if seed < 0:
        raise ConfigError(f"seed: must be >= 0 (got {seed})")
    data, phash = load_federated(params, paths)
    model, algorithm = check_run(params, run, seed, data)
    config = resolved_run_config(params, run, seed, phash)
    chash = config_hash({**config, "code": code_fingerprint()})
    comp_cfg = params.algorithm(run).uplink or params.train.compressor
    compressor = build_compressor(comp_cfg.name, **comp_cfg.model_dump(exclude={"name"}))
    name = run_name(run, seed)
    ckpt = paths.checkpoints / name / "state.pt"
    previous = ckpt_mod.load(ckpt, chash) if resume else None  # warns once if unreadable
    sidecar = ckpt.parent / RUN_ID_FILE  # the MLflow run of the last process that trained here
    if previous is None and params.tracking.enabled and sidecar.is_file():
        tracking.fail_if_running(
            params.tracking.uri,
            sidecar.read_text().strip(),
            "killed; its checkpoint could not be resumed, so the run restarted in a new run",
        )
    tracker = _open_tracker(
        params,
        run,
        seed,
        mlflow_run_name or name,
        config,
        phash,
        previous.run_id if previous else None,
        parent_run_id=parent_run_id,
        extra_tags=tags or {},
        partition_dir=paths.partition,
    )
    if tracker.run_id is not None:
        atomic.write_text(sidecar, tracker.run_id)
        if on_open is not None:
            on_open(tracker.run_id)
    try:
        lcfg = loop_config(params, seed, run)
        with round_progress(name, lcfg.rounds, enabled=show_progress) as bar:

            def progress(round_: int, metrics: Mapping[str, float | None]) -> None:
                bar(round_, metrics)
                if on_round is not None:
                    on_round(round_, metrics)

            result = loop.run(
                lcfg,
                algorithm,
                model,
                data,
                compressor,
                config_hash=chash,
                checkpoint_path=ckpt,
                tracker=tracker,
                resume=previous is not None,  # (loaded above: an unreadable one warns once)
                progress=progress,
            )
        # the backend that ran the clients (vectorized may fall back to sequential, logged)
        tracker.set_tags({"fedcomm.backend": result.backend})
        out = _write_run_outputs(paths.train_dir(run, seed), result, config, tracker.run_id)
        for f in ("rounds.parquet", "ledger.parquet", "clients.parquet", "model.safetensors"):
            tracker.log_artifact(out / f)
    except StopRun as stop:
        tracker.set_tags({"fedcomm.stopped": str(stop)})
        tracker.finish("KILLED")
        raise
    except BaseException:
        tracker.finish("KILLED" if sys.exc_info()[0] is KeyboardInterrupt else "FAILED")
        raise
    tracker.finish("FINISHED")
    ckpt.unlink(missing_ok=True)
    sidecar.unlink(missing_ok=True)
    return out


def loop_config(params: Params, seed: int, run: str | None = None) -> loop.LoopConfig:
    """The loop's view of ``train``; with ``run``, its rounds include the algorithm's extra rounds
    (ProgFed's warm-up rounds, which do not count toward ``train.rounds``)."""
    t = params.train
    extra = params.algorithm(run).extra_rounds() if run is not None else 0
    return loop.LoopConfig(
        rounds=t.rounds + extra,
        clients_per_round=t.clients_per_round,
        local=t.local,
        seed=seed,
        eval_every=t.eval_every,
        local_eval_every=t.local_eval_every,
        eval_batch_size=t.eval_batch_size,
        topk=t.topk,
        checkpoint_every=t.checkpoint_every,
        backend=t.backend,
        chunk_size=t.chunk_size,
        device=t.device,
        precision=t.precision,
        on_divergence=t.on_divergence,
        divergence_loss=t.divergence_loss,
        system=t.system,
        data_root=resolve_root(params.data.root) if t.system is not None else None,
    )


def check_run(
    params: Params, run: str, seed: int, data: FederatedTensors
) -> tuple[torch.nn.Module, Any]:
    """Everything about ``run`` that can fail on bad input, checked on the federated data before
    any training: the cohort and test splits fit the partition, the model fits the data (one
    example through it), the algorithm accepts the model. Returns the model and the algorithm.

    Raises:
        ConfigError: naming the key at fault.
    """
    params.algorithm(run)
    resolve_device(params.train.device)  # a device this machine lacks: DeviceError, now
    _check_fits(params, data)
    model = _check_model(params, data, seed)
    algorithm = build_algorithm(params.algorithm(run))
    if algorithm.validate_model is not None:
        try:
            algorithm.validate_model(model)
        except ValueError as err:
            raise ConfigError(f"algorithms.{run}: {err}") from None
    return model, algorithm


def check_experiment(params: Params) -> int:
    """What ``fedcomm config validate`` checks beyond the schema: the dataset loads from
    ``data.root``, the partition can be drawn (in memory, nothing written) and every run of the
    experiment passes :func:`check_run` on it. Returns the number of clients."""
    dataset = load_data(params)
    part = draw_partition(params, dataset)
    data = FederatedTensors.build(dataset, part.train, part.test)
    for run in params.experiment.runs:
        check_run(params, run, params.experiment.seeds[0], data)
    return data.num_clients


def _check_fits(params: Params, data: FederatedTensors) -> None:
    k = params.train.clients_per_round
    if k > data.num_clients:
        raise ConfigError(
            f"train.clients_per_round: {k} exceeds the partition's {data.num_clients} clients "
            f"(allowed: 1..{data.num_clients})"
        )
    if data.global_test.num_examples == 0:
        raise ConfigError(
            "partition.test_fraction: every client's test split is empty, so nothing can be "
            f"evaluated (got {params.partition.test_fraction}; use a value in (0, 1))"
        )


def _check_model(params: Params, data: FederatedTensors, seed: int) -> torch.nn.Module:
    """Build the run's model and pass one training example through it: a model that does not fit
    the data fails here, with a message naming both."""
    fit = f"(inputs {tuple(data.input_shape)}, {data.num_classes} classes)"
    try:
        model = build_run_model(params, data, seed)
    except ValueError as err:
        raise ConfigError(
            f"model: {params.model.name!r} does not fit dataset {params.data.dataset.name!r} "
            f"{fit}: {err}"
        ) from None
    sample = next((d.x[:1] for d in data.train if d.num_examples), None)
    if sample is None:
        raise ConfigError("partition: every client's train split is empty")
    try:
        with torch.no_grad():
            out = model(sample)
    except (RuntimeError, ValueError, IndexError) as err:
        raise ConfigError(
            f"model: {params.model.name!r} does not fit dataset {params.data.dataset.name!r} "
            f"{fit}: {err}"
        ) from None
    if out.shape[-1] != data.num_classes:
        raise ConfigError(
            f"model: {params.model.name!r} outputs {out.shape[-1]} classes, "
            f"dataset {params.data.dataset.name!r} has {data.num_classes}"
        )
    return model


def code_fingerprint() -> str:
    """sha256 of the library's source: a checkpoint never resumes under changed code."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _open_tracker(
    params: Params,
    run: str,
    seed: int,
    name: str,
    config: dict[str, Any],
    phash: str,
    run_id: str | None,
    *,
    parent_run_id: str | None = None,
    extra_tags: Mapping[str, str] = {},
    partition_dir: Path | None = None,
) -> tracking.MlflowTracker | tracking.NullTracker:
    if not params.tracking.enabled:
        return tracking.NullTracker()
    algo = params.algorithm(run)
    tags = {
        "fedcomm.kind": "train",
        "git_sha": _git_sha(),
        "git_dirty": _git_dirty(),
        "server_optimizer": algo.server.optimizer,
        "dvc.exp_name": os.environ.get("DVC_EXP_NAME", ""),
        "dvc.baseline_rev": os.environ.get("DVC_EXP_BASELINE_REV", ""),
        "partition_hash": phash,
        "algorithm": algo.name,
        "run": run,
        "seed": str(seed),
        "fedcomm_version": __version__,
        **extra_tags,
    }
    return tracking.open_run(
        uri=params.tracking.uri,
        experiment=params.tracking.experiment,
        run_name=name,
        tags=tags,
        params=config,
        run_id=run_id,
        parent_run_id=parent_run_id,
        dataset=None
        if partition_dir is None
        else partition_input(partition_dir, data_root=params.data.root),
    )


def _write_run_outputs(
    out: Path, result: loop.RunResult, config: dict[str, Any], run_id: str | None
) -> Path:
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


# --- evaluate ----------------------------------------------------------------------------------


def evaluate_stage(params: Params, run: str, seed: int, paths: Paths = Paths()) -> dict[str, Any]:
    """Summaries of a finished run plus the saved model's per-client evaluation.

    Writes ``runs/<name>/metrics.json`` (final, best, at_budget, at_upload_cap, to_target, time,
    upload, saved_model)
    and ``runs/<name>/eval_clients.parquet`` (the final global model on each client's test
    split), and logs the summaries to the run's MLflow run.
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
    )
    model = build_run_model(params, data, seed)
    algorithm = build_algorithm(params.algorithm(run))
    if algorithm.prepare_model is not None:  # e.g. ProgFed: the saved sub-model's structure
        model = algorithm.prepare_model(model, seed)
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
    atomic.write_json(out / "metrics.json", summary)
    plots = _run_plots(run_name(run, seed), rounds, out / "plots")
    if tr is not None:
        flat = {k: float(v) for k, v in tracking.flatten(summary).items() if _is_float(v)}
        tr.log_metrics({f"summary/{k}": v for k, v in flat.items()})
        tr.log_artifact(out / "eval_clients.parquet")
        tr.log_artifact(out / "metrics.json")
        for png in plots:
            tr.log_artifact(png, "plots")
    return summary


def _run_plots(name: str, rounds: pl.DataFrame, out: Path) -> list[Path]:
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


def upload_summary(ledger: pl.DataFrame, dense_model_bits: int) -> dict[str, float | None]:
    """Mean upload per client per round (one up message), in bytes and decimal KB (FedBIAD's
    Table I/II unit), and ``up_ratio_mean``: the mean over training rounds of the dense model's
    upload over the sent upload (FedDST's ~5x at sparsity 0.8; see
    :func:`~fedcomm.evaluation.summaries.upload_ratios`)."""
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
