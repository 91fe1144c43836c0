"""A training run's identity: its name, the config that determines its numbers, that config's
hash (which a checkpoint must match to resume), the library's code fingerprint and the git state
it ran at (the MLflow run's name, params and tags)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedcomm.config import Params

LIBRARY = Path(__file__).resolve().parent.parent  # src/fedcomm: the code a fingerprint covers


def run_name(run: str, seed: int) -> str:
    return f"{run}-s{seed}"


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
        # (the processes a run trains on do not change its numbers: docs/speed.md)
        "train": params.train.model_dump(mode="json", exclude={"nproc"}),
    }


def config_hash(config: Mapping[str, Any]) -> str:
    blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def code_fingerprint() -> str:
    """sha256 of the library's source (each file's path under ``src/fedcomm`` and its bytes): a
    checkpoint never resumes under changed code."""
    h = hashlib.sha256()
    for f in sorted(LIBRARY.rglob("*.py")):
        h.update(str(f.relative_to(LIBRARY)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, timeout=10
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def git_dirty() -> str:
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
