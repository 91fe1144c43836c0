"""``train.device``: where a run's model, client data, training and evaluation live.

:func:`resolve` turns the configured name into a :class:`torch.device` and refuses, with a
:class:`DeviceError` naming the key, a device this machine lacks. :func:`run_on` sets the
numerics a run needs on that device for as long as it trains, and restores them after.

**Determinism per device.** Every random draw of a run (partition, initial weights, client
batches, dropout masks, stochastic quantisers, gates' noise) comes from a CPU
:class:`torch.Generator` of :mod:`fedcomm.seeding` and is then moved to the device. So what is
drawn, and therefore what is sent and charged in the ledger, does not depend on the device.
Arithmetic does: the same seed on the same device and torch build gives the same numbers
(tested on CPU; on CUDA, :func:`run_on` turns on ``torch.use_deterministic_algorithms``, fixes
cuBLAS's workspace and turns TF32 off, so fp32 means fp32). Across devices, kernels sum in
different orders, so losses and accuracies agree to float rounding at first and may drift apart
over many rounds, as any two float programs do; payload sizes that depend only on shapes and
draws (dense, masks, quantised levels of a fixed count) match exactly, those that depend on
trained values (thresholds, top-k ties) can differ once the values do.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from fedcomm.errors import InputError

DEVICE_PATTERN = r"^(auto|cpu|mps|cuda(:[0-9]+)?)$"
CUBLAS_ENV = "CUBLAS_WORKSPACE_CONFIG"  # cuBLAS is deterministic only with a fixed workspace


class DeviceError(InputError, ValueError):
    """``train.device`` names a device this machine does not have."""


def available() -> list[str]:
    """The values of ``train.device`` this machine accepts."""
    names = ["auto", "cpu"]
    if torch.cuda.is_available():
        names += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if _mps_available():
        names.append("mps")
    return names


def resolve(name: str) -> torch.device:
    """The device ``train.device: name`` means here: ``auto`` is the first CUDA device when
    there is one, else the CPU (never MPS: ask for it by name).

    Raises:
        DeviceError: the device is not present, naming what is.
    """
    if name == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if name not in available():
        why = {
            "cuda": "this torch build has no CUDA or no GPU is visible"
            if not torch.cuda.is_available()
            else f"this machine has {torch.cuda.device_count()} CUDA device(s)",
            "mps": "this machine has no Apple MPS device",
        }.get(name.split(":")[0], "not a device name")
        raise DeviceError(
            f"train.device: {name!r} is not available ({why}); allowed here: {available()}"
        )
    device = torch.device(name)
    return torch.device("cuda", 0) if device.type == "cuda" and device.index is None else device


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


@contextmanager
def run_on(device: torch.device) -> Iterator[None]:
    """Deterministic fp32 numerics on ``device`` while a run trains (restored afterwards).

    On CUDA: deterministic algorithms (a kernel without a deterministic form warns once rather
    than stopping the run), cuDNN without autotuning, and no TF32 in matmuls or convolutions.
    On the CPU nothing needs changing: its kernels are deterministic for a fixed thread count.
    """
    if device.type != "cuda":
        yield
        return
    os.environ.setdefault(CUBLAS_ENV, ":4096:8")  # read when cuBLAS starts (the first matmul)
    torch.cuda.set_device(device)
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
        torch.backends.cuda.matmul.allow_tf32,
        torch.backends.cudnn.allow_tf32,
    )
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark = saved[2]
        torch.backends.cudnn.deterministic = saved[3]
        torch.backends.cuda.matmul.allow_tf32 = saved[4]
        torch.backends.cudnn.allow_tf32 = saved[5]


def autocast_dtype(precision: str) -> torch.dtype | None:
    """``train.precision``'s autocast dtype (None: plain fp32)."""
    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]


@contextmanager
def precision(device: torch.device, name: str) -> Iterator[None]:
    """Local training's autocast for ``train.precision`` (nothing for fp32)."""
    dtype = autocast_dtype(name)
    if dtype is None:
        yield
        return
    with torch.autocast(device_type=device.type, dtype=dtype):
        yield


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (timings of asynchronous devices)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def free_bytes(device: torch.device) -> int:
    """Memory a run could still allocate on ``device``: CUDA's free memory plus what torch's
    caching allocator holds unused; the CPU's ``MemAvailable`` (Linux), else a third of RAM."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        reserved = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free + reserved)
    if device.type == "mps":
        return int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    return int(pages * os.sysconf("SC_PAGE_SIZE")) // 3 if pages else 8 << 30
