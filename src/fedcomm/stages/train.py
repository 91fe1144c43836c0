"""The train stage: one (algorithm run, seed) trained and its outputs written
(``runs/<run>-s<seed>/train/``), resuming from a checkpoint of the same config and code.

Everything that can fail on bad input is checked first (:func:`check_run`; over every run of the
experiment, :func:`check_experiment`, which ``fedcomm config validate`` calls), so a bad
configuration leaves no MLflow run and no file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from fedcomm import __version__, atomic
from fedcomm.algorithms import build_algorithm
from fedcomm.comm.codecs import Compressor, build_compressor
from fedcomm.config import ConfigError, Params, model_options
from fedcomm.data.datasets.registry import resolve_root
from fedcomm.errors import InputError, Interrupted, interrupts_deferred, stopping
from fedcomm.models import build_seeded_model
from fedcomm.simulation import checkpoint as ckpt_mod
from fedcomm.simulation import fitting, loop, shard
from fedcomm.simulation.data import FederatedTensors
from fedcomm.simulation.device import resolve as resolve_device
from fedcomm.simulation.progress import round_progress
from fedcomm.stages.identity import (
    code_fingerprint,
    config_hash,
    git_dirty,
    git_sha,
    resolved_run_config,
    run_name,
)
from fedcomm.stages.outputs import write_run_outputs
from fedcomm.stages.partition import draw_partition, load_data, load_federated
from fedcomm.stages.paths import Paths
from fedcomm.tracking import mlflow as tracking
from fedcomm.tracking.inputs import partition_input

RoundCallback = Callable[[int, Mapping[str, float | None]], None]


class StopRun(Exception):
    """Raised by a round callback to end a run early (e.g. a sweep pruning a trial): the run's
    MLflow run is marked KILLED with the reason as tag ``fedcomm.stopped``; no outputs are
    written and the checkpoint is kept."""


RUN_ID_FILE = "mlflow_run_id"  # beside a run's checkpoint: the MLflow run training it


def build_run_model(params: Params, data: FederatedTensors, seed: int) -> torch.nn.Module:
    """The model, initialised from the ``(seed, INIT)`` stream."""
    return build_seeded_model(
        params.model.name,
        seed,
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

    Ctrl-C once the checkpoint was read raises :class:`~fedcomm.errors.Interrupted` (the round
    being trained, the checkpoint's round) and marks the MLflow run ``KILLED``; the MLflow run
    and the file naming it beside the checkpoint, and the run's set of outputs, are written
    whole before it takes effect.

    Under ``torchrun`` (``train.nproc`` > 1, :mod:`fedcomm.simulation.shard`) every process
    calls this; rank 0 does all of the above, the other ranks train their share of each round
    and write nothing.
    """
    sharded = shard.start(resolve_device(params.train.device))  # under torchrun: this rank
    try:
        return _train_stage(
            params, run, seed, paths, sharded, resume=resume, show_progress=show_progress,
            parent_run_id=parent_run_id, tags=tags, on_round=on_round, on_open=on_open,
            mlflow_run_name=mlflow_run_name,
        )  # fmt: skip
    finally:
        shard.finish(sharded)


def _train_stage(
    params: Params,
    run: str,
    seed: int,
    paths: Paths,
    sharded: shard.Shard | None,
    *,
    resume: bool,
    show_progress: bool | None,
    parent_run_id: str | None,
    tags: Mapping[str, str] | None,
    on_round: RoundCallback | None,
    on_open: Callable[[str], None] | None,
    mlflow_run_name: str | None,
) -> Path:
    if seed < 0:
        raise ConfigError(f"seed: must be >= 0 (got {seed})")
    data, phash = load_federated(params, paths)
    model, algorithm = check_run(params, run, seed, data)
    config = resolved_run_config(params, run, seed, phash)
    chash = config_hash({**config, "code": code_fingerprint()})
    compressor = run_compressor(params, run)
    name = run_name(run, seed)
    ckpt = paths.checkpoints / name / "state.pt"
    previous = ckpt_mod.load(ckpt, chash) if resume else None  # warns once if unreadable
    if sharded is not None and not sharded.writes:  # rank 0 tracks, shows and writes
        loop.run(
            loop_config(params, seed, run), algorithm, model, data, compressor,
            config_hash=chash, checkpoint_path=ckpt, resume=previous is not None, sharded=sharded,
        )  # fmt: skip
        return paths.train_dir(run, seed)
    kept = previous.round_ if previous is not None else 0  # the checkpoint's round
    sidecar = ckpt.parent / RUN_ID_FILE  # the MLflow run of the last process that trained here
    if previous is None and params.tracking.enabled and sidecar.is_file():
        tracking.fail_if_running(
            params.tracking.uri,
            sidecar.read_text().strip(),
            "killed; its checkpoint could not be resumed, so the run restarted in a new run",
        )
    tracker: tracking.MlflowTracker | tracking.NullTracker = tracking.NullTracker()
    result: loop.RunResult | None = None
    try:
        with interrupts_deferred():  # no MLflow run left RUNNING without its id beside the ckpt
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
        if tracker.run_id is not None and on_open is not None:
            on_open(tracker.run_id)
        lcfg = loop_config(params, seed, run)
        with round_progress(name, lcfg.rounds, enabled=show_progress, start=kept) as bar:

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
                sharded=sharded,
            )
        # the backend that ran the clients (vectorized may fall back to sequential, logged)
        tracker.set_tags({"fedcomm.backend": result.backend})
        with interrupts_deferred():  # the outputs all of this run, never some of an older one
            out = write_run_outputs(paths.train_dir(run, seed), result, config, tracker.run_id)
        for f in ("rounds.parquet", "ledger.parquet", "clients.parquet", "model.safetensors"):
            tracker.log_artifact(out / f)
    except StopRun as stop:
        tracker.set_tags({"fedcomm.stopped": str(stop)})
        tracker.finish("KILLED")
        raise
    except KeyboardInterrupt as stop:
        stopping()
        tracker.finish("KILLED")
        if isinstance(stop, Interrupted):
            raise
        if result is None:  # before round 1 of this process, or the loop had not read the ckpt
            raise Interrupted(kept + 1, kept) from None
        raise Interrupted(result.state.round_, result.checkpoint_round) from None  # after the last
    except BaseException:
        tracker.finish("FAILED")
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
        compile=t.compile,
        device=t.device,
        precision=t.precision,
        on_divergence=t.on_divergence,
        divergence_loss=t.divergence_loss,
        system=t.system,
        data_root=resolve_root(params.data.root) if t.system is not None else None,
        codec=(params.algorithm(run).uplink if run is not None else None) or t.compressor,
    )


def run_compressor(params: Params, run: str) -> Compressor:
    """The uplink compressor of ``run``: its algorithm's ``uplink``, else ``train.compressor``."""
    comp_cfg = params.algorithm(run).uplink or params.train.compressor
    return build_compressor(comp_cfg.name, **comp_cfg.model_dump(exclude={"name"}))


def train_in_memory(params: Params, run: str, seed: int, data: FederatedTensors) -> loop.RunResult:
    """One (run, seed) trained exactly as :func:`train_stage` trains it (the same model init,
    algorithm, compressor and loop config) but in memory: no checkpoint, no MLflow run, no
    files. For short seeded checks of a profile (the fidelity guards, one-change scans)."""
    model, algorithm = check_run(params, run, seed, data)
    lcfg = loop_config(params, seed, run)
    return loop.run(lcfg, algorithm, model, data, run_compressor(params, run), config_hash="mem")


def check_run(
    params: Params, run: str, seed: int, data: FederatedTensors
) -> tuple[torch.nn.Module, Any]:
    """Everything about ``run`` that can fail on bad input, checked on the federated data before
    any training: the cohort and test splits fit the partition, the model fits the data (one
    example through it), the algorithm accepts the model, ``fit_deadline``'s ladder is a setting
    of the run's codec or algorithm. Returns the model and the algorithm.

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
    _check_fit(params, run)
    return model, algorithm


def _check_fit(params: Params, run: str) -> None:
    """``fit_deadline``'s ladder is a setting ``run``'s codec or algorithm has."""
    system = params.train.system
    if system is None or system.policy.compression.kind != "fit_deadline":
        return
    fit, algo = system.policy.compression, params.algorithm(run)
    try:
        fitting.ladder(algo.uplink or params.train.compressor, fit.ladder, algo, fit.vary)
    except InputError as err:
        raise ConfigError(f"algorithms.{run}: {err}") from None


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
        "git_sha": git_sha(),
        "git_dirty": git_dirty(),
        "server_optimizer": algo.server.optimizer,
        tracking.DVC_EXP_TAG: tracking.dvc_exp_name(),
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
