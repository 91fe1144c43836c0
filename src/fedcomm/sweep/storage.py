"""Where a sweep's study lives, and how a worker opens (creates or joins) it.

Storage (``storage`` in the space file): null = ``JournalStorage`` in ``.optuna/<study>.log``
under the project root (safe for parallel workers on one machine or NFS), or the journal at a
path ending in ``.log``; an RDB URL (say ``postgresql+psycopg://user@host/db``) for workers on
several machines, with Optuna's heartbeat (every ``HEARTBEAT_S`` seconds) so a killed worker's
trial is failed and retried (:mod:`fedcomm.sweep.workers`). The worker whose ``create_study``
succeeds stores the fingerprint of the space and base params in the study's user attributes; a
worker that joins seeds its sampler apart from the creator's and refuses a study started from
another space.
"""

from __future__ import annotations

import hashlib
import json
import time
import zlib
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages import RetryHeartbeatStaleTrialCallback as RetryStale
from optuna.storages.journal import JournalFileBackend

from fedcomm.config import ConfigError
from fedcomm.sweep.space import Sweep, trial_params
from fedcomm.sweep.workers import worker_id

FINGERPRINT_ATTR = "fedcomm_space_fingerprint"
HEARTBEAT_S = 30


def masked(url: str | None) -> str:
    """A storage URL with its password hidden (what logs and MLflow may show)."""
    if url is None or "://" not in url:
        return str(url)
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.split("://", 1)[0] + "://***"


def open_storage(url: str | None, study: str, root: Path) -> BaseStorage:
    """The study's storage: a journal file by default, an RDB (PostgreSQL) URL across machines."""
    if url is None or url.endswith(".log"):
        path = journal_path(url, study, root)
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if url.startswith(("postgresql", "mysql", "sqlite")):
        for attempt in range(5):  # workers starting together race on creating a fresh schema
            try:
                return RDBStorage(
                    url,
                    heartbeat_interval=HEARTBEAT_S,
                    grace_period=4 * HEARTBEAT_S,
                    failed_trial_callback=RetryStale(max_retry=2),
                )
            except Exception as err:
                if attempt == 4:
                    raise ConfigError(f"storage={masked(url)}: cannot open: {err}") from None
                time.sleep(1.0 + attempt)
    raise ConfigError(
        f"storage={masked(url)}: expected null (journal file), a path ending in .log, or an RDB "
        "URL (postgresql+psycopg://..., sqlite:///...)"
    )


def journal_path(url: str | None, study: str, root: Path) -> Path:
    return root / ".optuna" / f"{study}.log" if url is None else root / url


def _sampler(sweep: Sweep, joined: bool) -> optuna.samplers.BaseSampler:
    seed = sweep.sampler.seed if sweep.sampler.seed is not None else sweep.seeds[0]
    if joined:  # a second worker must not replay the creator's random start-up trials
        seed = (seed + zlib.crc32(worker_id().encode())) % 2**31
    if sweep.sampler.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if sweep.sampler.name == "nsga2":
        return optuna.samplers.NSGAIISampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _pruner(sweep: Sweep) -> optuna.pruners.BasePruner:
    """The warm-up rounds are applied per seed by the reporter (Optuna's ``n_warmup_steps``
    would count steps across seeds), so the pruners themselves start at step 0."""
    p = sweep.active_pruner
    if p.name == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.startup_trials)
    if p.name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, p.warmup_rounds))
    return optuna.pruners.NopPruner()


def open_study(sweep: Sweep, storage: BaseStorage, fingerprint: str) -> tuple[optuna.Study, bool]:
    """Create the study, or join it; returns (study, created)."""
    name = sweep.study or "study"
    created = True
    try:
        optuna.create_study(study_name=name, storage=storage, directions=sweep.objective.directions)
    except optuna.exceptions.DuplicatedStudyError:
        created = False
    study = optuna.load_study(
        study_name=name,
        storage=storage,
        sampler=_sampler(sweep, joined=not created),
        pruner=_pruner(sweep),
    )
    got = [d.name.lower() for d in study.directions]
    if got != sweep.objective.directions:
        raise ConfigError(
            f"study {name!r} exists with directions {got}, the space asks for "
            f"{sweep.objective.directions}: rename the study (`study:`) or delete its storage"
        )
    if created:
        study.set_user_attr(FINGERPRINT_ATTR, fingerprint)
    return study, created


def fingerprint(sweep: Sweep, base_raw: dict[str, Any]) -> str:
    """The space and what of the base params reaches the tuned run (data, partition, model,
    train, evaluate and ``algorithms.<run>``): editing another algorithm's block, or applying
    the best values to ``params.yaml`` as a DVC experiment, does not change it."""
    params = trial_params(sweep, base_raw, {})
    relevant = params.model_dump(
        mode="json", include={"data", "partition", "model", "train", "evaluate"}
    )
    relevant["run"] = params.algorithm(sweep.run).model_dump(mode="json")
    space = sweep.fingerprint({})
    blob = json.dumps({"space": space, "base": relevant}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def wait_attr(study: optuna.Study, key: str, timeout_s: float = 120.0) -> Any:
    """A user attribute the creating worker sets right after creating the study."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = study.user_attrs.get(key)
        if value is not None or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def check_fingerprint(study: optuna.Study, expected: str) -> None:
    stored = wait_attr(study, FINGERPRINT_ATTR)
    if stored is not None and stored != expected:
        raise ConfigError(
            f"study {study.study_name!r} was started from a different search space or base params "
            f"(fingerprint {stored} != {expected}): only `trials`, `storage`, `max_failures` and "
            "`experiment` may change when continuing a study; rename the study to start anew"
        )
