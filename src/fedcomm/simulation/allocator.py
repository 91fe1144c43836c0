"""glibc malloc tuning for training loops that allocate the same large tensors every step.

By default glibc serves allocations above a dynamic threshold (128 KiB, growing to at most
32 MiB) with ``mmap`` and returns them to the kernel with ``munmap`` when freed, and trims the top
of the heap beyond 128 KiB. A training step allocates and frees its activations, gradients and
update temporaries every time: a stacked chunk of 100 MLP clients is a 40 MiB gradient per layer,
which is then mapped, page-faulted and zero-filled by the kernel, and unmapped again, each
step. Raising the mmap threshold and the trim threshold keeps those pages in the process heap
for reuse (measured in ``benchmarks/backends.py --malloc both``: about 1.5-2x on the batched
MLP step). The cost: freed memory is kept by the process (peak RSS is reached once and held).

``FEDCOMM_MALLOC_TUNING=0`` leaves glibc's defaults alone; non-glibc platforms are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import sys

log = logging.getLogger(__name__)

ENV = "FEDCOMM_MALLOC_TUNING"
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD = 1 << 30  # bytes: allocations below 1 GiB come from the heap, kept when freed

_state: dict[str, bool] = {}


def tune() -> bool:
    """Apply the tuning once per process; True if it is in effect."""
    if "applied" in _state:
        return _state["applied"]
    applied = False
    if os.environ.get(ENV, "1") != "0" and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            ok_mmap = libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD)
            ok_trim = libc.mallopt(M_TRIM_THRESHOLD, THRESHOLD)
            applied = bool(ok_mmap and ok_trim)
        except (OSError, AttributeError) as err:  # not glibc
            log.debug("malloc tuning unavailable: %s", err)
    _state["applied"] = applied
    return applied
