"""Where things live: the project root (escaping DVC's temporary experiment copies), the name of
a run's folder, and the cache dir (what is worth keeping between processes: decoded images, the
plot pages' JavaScript bundle)."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT_ENV = "FEDCOMM_PROJECT_ROOT"
CACHE_ENV = "FEDCOMM_CACHE_DIR"
RUN_DIR = re.compile(r"^(?P<run>.+)-s(?P<seed>\d+)$")  # a run's folder: runs/<run>-s<seed>


def project_root(start: Path | None = None) -> Path:
    """The project's root directory, absolute.

    ``$FEDCOMM_PROJECT_ROOT`` wins. Otherwise the nearest ancestor of ``start`` (default: the
    working directory) holding ``dvc.yaml`` or ``params.yaml``, except that a DVC experiment
    running in a temporary copy (DVC keeps those inside ``<root>/.dvc``) maps back to ``<root>``, so
    shared stores (MLflow, Optuna) are the workspace's.
    """
    env = os.environ.get(ROOT_ENV)
    if env:
        return Path(env).resolve()
    here = (start or Path.cwd()).resolve()
    parts = here.parts
    for i in range(len(parts) - 2):
        if parts[i : i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    for candidate in (here, *here.parents):
        if (candidate / "dvc.yaml").is_file() or (candidate / "params.yaml").is_file():
            return candidate
    return here


def cache_root() -> Path:
    """``$FEDCOMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedcomm``, else ``~/.cache/fedcomm``."""
    env = os.environ.get(CACHE_ENV, "")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fedcomm"
