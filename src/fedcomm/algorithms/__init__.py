"""Algorithms: one module per single-file algorithm, one package per paper that spans several.

``core`` is the machinery they share (the contract and registry, the local step, jobs);
``submodel`` is the sub-model family's shared rule, codec and merge, ``sparse`` the sparse-mask
family's masks, budgets, messages and config. Importing this package imports every other
submodule and subpackage, so each ``@register`` runs and the config union in
:mod:`fedcomm.config` and the contract tests see every algorithm.
"""

from __future__ import annotations

import importlib
import pkgutil

from fedcomm.algorithms.core import (
    ALGORITHMS,
    CONFIGS,
    AlgorithmConfig,
    FedAlgorithm,
    build_algorithm,
)

SHARED = frozenset({"core", "sparse", "submodel"})  # the pieces algorithms compose

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_") and _mod.name not in SHARED:
        importlib.import_module(f"{__name__}.{_mod.name}")

__all__ = ["ALGORITHMS", "CONFIGS", "AlgorithmConfig", "FedAlgorithm", "build_algorithm"]
