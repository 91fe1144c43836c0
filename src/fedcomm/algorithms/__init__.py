"""Algorithms: one module each, found through the registry in :mod:`.base`.

Importing this package imports every public submodule, so each ``@register`` runs and the
config union in :mod:`fedcomm.config` and the contract tests see every algorithm.
"""

from __future__ import annotations

import importlib
import pkgutil

from fedcomm.algorithms.base import (
    ALGORITHMS,
    CONFIGS,
    AlgorithmConfig,
    FedAlgorithm,
    build_algorithm,
)

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_") and _mod.name != "base":
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = ["ALGORITHMS", "CONFIGS", "AlgorithmConfig", "FedAlgorithm", "build_algorithm"]
