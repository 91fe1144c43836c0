"""The dataset registry: registry name -> loader, the data root, and :func:`load_dataset`.

Each loader module of :mod:`fedcomm.data.datasets` registers its loaders with :func:`register`
when the package is imported (importing this module imports the package first), so
:data:`DATASETS` always holds every dataset.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from fedcomm.data._registry import add_entry
from fedcomm.data.datasets.verify import DATA_ROOT_ENV
from fedcomm.data.types import Dataset

Loader = Callable[[Path | None, Mapping[str, Any]], Dataset]
DATASETS: dict[str, Loader] = {}


def resolve_root(root: str | Path | None) -> Path | None:
    """The data root: explicit ``root`` wins, else ``$FEDCOMM_DATA_ROOT``, else ``None``.

    Args:
        root: an explicit data root (``data.root`` of ``params.yaml``); ``None`` or ``""`` defer
            to the environment variable.

    Returns:
        The root with ``~`` expanded, or ``None`` when neither is set.
    """
    if root is not None and str(root) != "":
        return Path(root).expanduser()
    env = os.environ.get(DATA_ROOT_ENV, "")
    return Path(env).expanduser() if env else None


def register(name: str) -> Callable[[Loader], Loader]:
    """Decorator adding a loader to :data:`DATASETS` under ``name``.

    Args:
        name: registry name; registering a name twice raises ``ValueError``.

    Returns:
        A decorator that registers and returns the loader unchanged.
    """

    def deco(fn: Loader) -> Loader:
        add_entry(DATASETS, "dataset", name, fn)
        return fn

    return deco


def load_dataset(name: str, root: str | Path | None = None, **options: Any) -> Dataset:
    """Load dataset ``name`` from ``root`` (see :func:`resolve_root`) with loader ``options``.

    Args:
        name: a key of :data:`DATASETS`.
        root: data root; ``None`` falls back to ``$FEDCOMM_DATA_ROOT``.
        **options: loader-specific options (see each loader's docstring).

    Returns:
        The pooled dataset (official train split first, then test).

    Raises:
        ValueError: unknown name, or a bad / unknown option.
        DatasetNotFoundError: the dataset's files are missing.
        DatasetFileError: a dataset file is empty, truncated, corrupted or of another format.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; registered: {', '.join(sorted(DATASETS))}")
    return DATASETS[name](resolve_root(root), options)
