"""Uplink compressors (DGC, STC, SignSGD, FedPAQ; ProgFed's LQ and SP), registered by name.

Importing this package imports every public submodule, so each ``@register_compressor`` runs;
:mod:`fedcomm.comm.codecs` imports it once its registry exists. The contract every compressor
follows (only float ``Dense`` entries are compressed, everything else passes through; state is
returned, never mutated; randomness only from the given generator) is stated in
:mod:`fedcomm.comm.codecs`.
"""

from __future__ import annotations

import importlib
import pkgutil

for _mod in pkgutil.iter_modules(__path__):
    if not _mod.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_mod.name}")
