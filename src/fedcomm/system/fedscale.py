"""FedScale's device and behaviour traces -> fedcomm's client table and windows, safely.

FedScale (Lai et al., ICML 2022; ``SymbioticLab/FedScale``, ``benchmark/dataset/data/
device_info/``) ships two Python pickles:

- ``client_device_capacity``: ``{client_id: {'computation': ms per sample, 'communication':
  kbit/s}}`` (500,000 devices). ``computation`` is AI-Benchmark inference latency per sample
  (FedScale charges ``3 x batch x steps x computation / 1000`` s); ``communication`` is one
  MobiPerf bandwidth for both directions (FedScale divides kbit by it: ``fedscale/cloud/
  internal/client_metadata.py``, ``get_completion_time``). -> ``clients.parquet``:
  ``down_mbps = up_mbps = communication / 1000`` (FedScale has one number for both), and
  ``compute_speed = median(computation) / computation`` (the median device is 1.0; a device
  twice as slow per sample is 0.5).
- ``client_behave_trace``: ``{client_id: {'duration', 'inactive': [s], 'finish_time': s,
  'active': [s], 'model'}}`` (107,749 devices, from FLASH's 136k-user trace). -> ``windows.
  parquet``: one window ``[active[i], inactive[i])`` per pair, ``period_s = finish_time``.
  FedScale's reading (``fedscale/cloud/internal/client_metadata.py``, ``is_active``, and
  ``fedscale/cloud/client_manager.py``, which loads the file): the time is taken modulo
  ``finish_time`` and the client is online iff ``active[i] <= t <= inactive[i]`` for some
  ``i < len(active)``. Its method walks the pairs with a cursor that assumes time only moves
  forward; the windows keep the intended, stateless reading. Pairs with ``inactive[i] <=
  active[i]`` hold no online time (FedScale: at most an instant) and are left out; windows are
  clipped to ``[0, finish_time]`` and overlapping ones merged. ``duration`` and ``model`` are
  not used.

Unpickling runs whatever code a pickle names, so these files are never ``pickle.load``-ed: the
unpickler refuses every global (the format needs none: dicts, lists, str, int, float), and a
pickle that names one -- to call ``os.system``, say -- raises InputError before anything of it
runs. Both inputs are read and checked in full before anything is written, and each output
appears whole or not at all (:mod:`fedcomm.atomic`).
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from fedcomm.atomic import atomic_path
from fedcomm.errors import InputError, one_line

CLIENTS_FILE = "clients.parquet"
WINDOWS_FILE = "windows.parquet"


class _Refused(Exception):
    """A pickle asked for a global (a class or function): the one way it could run code."""


class _DataOnlyUnpickler(pickle.Unpickler):
    """Builds only pickle's own containers and scalars; any global is refused before it is
    looked up, so no constructor, ``__reduce__`` callable or ``__setstate__`` can run."""

    def find_class(self, module: str, name: str) -> Any:
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused(f"persistent id {pid!r}")


def load_data_pickle(path: Path) -> Any:
    """The data of a pickle of plain dicts, lists, str, int and float; refuses anything else."""
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        with open(path, "rb") as handle:
            return _DataOnlyUnpickler(handle).load()
    except _Refused as err:
        raise InputError(
            f"{path}: refused: the pickle asks for {err} (code, not data); FedScale's traces "
            "hold only dicts, lists, numbers and strings, so nothing of it was run"
        ) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, MemoryError) as err:
        raise InputError(f"{path}: not a readable pickle ({one_line(err)})") from None


def _number(path: Path, key: object, field: str, value: object, *, positive: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{path}: client {key!r}: {field} is {value!r} (expected a number)")
    out = float(value)
    if not math.isfinite(out) or out < 0 or (positive and out == 0):
        allowed = "> 0" if positive else ">= 0"
        raise InputError(
            f"{path}: client {key!r}: {field} is {value!r} (expected finite, {allowed})"
        )
    return out


def _mapping(path: Path, data: object, what: str) -> Mapping[object, object]:
    if not isinstance(data, dict) or not data:
        raise InputError(
            f"{path}: expected a non-empty dict client_id -> {what}, got {type(data).__name__}"
        )
    return data


def _client_ids(path: Path, keys: list[object]) -> np.ndarray:
    """Integer keys (or strings of digits) as int64 >= 0, distinct."""
    ids = []
    for key in keys:
        if isinstance(key, int) and not isinstance(key, bool) and key >= 0:
            ids.append(key)
        elif isinstance(key, str) and key.isdecimal():
            ids.append(int(key))
        else:
            raise InputError(f"{path}: client id {key!r} is not an integer >= 0")
    out = np.asarray(ids, dtype=np.int64)
    if len(np.unique(out)) != len(out):
        raise InputError(f"{path}: client ids repeat once read as integers (e.g. 7 and '7')")
    return out


def device_table(path: Path, data: object) -> pl.DataFrame:
    """``client_device_capacity``'s dict -> the client table (``read_client_table``'s columns)."""
    devices = _mapping(path, data, "{'computation': ms/sample, 'communication': kbit/s}")
    ms, kbps = [], []
    for key, spec in devices.items():
        if not isinstance(spec, dict) or not {"computation", "communication"} <= spec.keys():
            raise InputError(
                f"{path}: client {key!r}: expected {{'computation': ..., 'communication': ...}}, "
                f"got {spec!r:.80}"
            )
        ms.append(_number(path, key, "computation", spec["computation"], positive=True))
        kbps.append(_number(path, key, "communication", spec["communication"], positive=True))
    computation = np.asarray(ms)  # ms per sample (inference), lower = faster
    mbps = np.asarray(kbps) / 1e3  # kbit/s -> Mbit/s, the same number for both directions
    return pl.DataFrame(
        {
            "client_id": _client_ids(path, list(devices)),
            "down_mbps": mbps,
            "up_mbps": mbps,
            "compute_speed": float(np.median(computation)) / computation,
        }
    ).sort("client_id")


def _windows_of(path: Path, key: object, spec: object) -> tuple[float, list[tuple[float, float]]]:
    """One device's period and merged online windows, FedScale's reading (module docstring)."""
    need = {"active", "inactive", "finish_time"}
    if not isinstance(spec, dict) or not need <= spec.keys():
        raise InputError(
            f"{path}: client {key!r}: expected a dict with 'active', 'inactive', 'finish_time', "
            f"got {spec!r:.80}"
        )
    period = _number(path, key, "finish_time", spec["finish_time"], positive=True)
    active, inactive = spec["active"], spec["inactive"]
    for field, value in (("active", active), ("inactive", inactive)):
        if not isinstance(value, list):
            raise InputError(f"{path}: client {key!r}: {field} is {value!r:.80} (expected a list)")
    if len(inactive) < len(active):
        raise InputError(
            f"{path}: client {key!r}: {len(active)} active but {len(inactive)} inactive times "
            "(FedScale pairs active[i] with inactive[i])"
        )
    pairs = []
    for i, (on, off) in enumerate(zip(active, inactive[: len(active)], strict=True)):
        start = min(_number(path, key, f"active[{i}]", on, positive=False), period)
        end = min(_number(path, key, f"inactive[{i}]", off, positive=False), period)
        if end > start:
            pairs.append((start, end))
    merged: list[tuple[float, float]] = []
    for start, end in sorted(pairs):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return period, merged


def behave_windows(path: Path, data: object) -> pl.DataFrame:
    """``client_behave_trace``'s dict -> windows (``read_windows``' columns, with period_s)."""
    traces = _mapping(path, data, "{'active': [...], 'inactive': [...], 'finish_time': ...}")
    ids = _client_ids(path, list(traces))
    rows: dict[str, list[Any]] = {"client_id": [], "start_s": [], "end_s": [], "period_s": []}
    for client, (key, spec) in zip(ids.tolist(), traces.items(), strict=True):
        period, windows = _windows_of(path, key, spec)
        for start, end in windows:
            rows["client_id"].append(client)
            rows["start_s"].append(start)
            rows["end_s"].append(end)
            rows["period_s"].append(period)
    schema = {"client_id": pl.Int64, "start_s": pl.Float64, "end_s": pl.Float64}
    return pl.DataFrame(rows, schema={**schema, "period_s": pl.Float64}).sort(
        "client_id", "start_s"
    )


def convert_fedscale(device: Path | None, behave: Path | None, out_dir: Path) -> list[Path]:
    """FedScale's ``client_device_capacity`` and/or ``client_behave_trace`` pickles ->
    ``out_dir/clients.parquet`` and/or ``out_dir/windows.parquet``; returns the paths written.

    Both inputs are read and checked before anything is written; nothing is half-written.
    """
    if device is None and behave is None:
        raise InputError("convert-fedscale: give --device, --behave or both (got neither)")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"{out_dir}: exists and is not a folder (--out)")
    frames: list[tuple[Path, pl.DataFrame]] = []
    if device is not None:
        frames.append((out_dir / CLIENTS_FILE, device_table(device, load_data_pickle(device))))
    if behave is not None:
        frames.append((out_dir / WINDOWS_FILE, behave_windows(behave, load_data_pickle(behave))))
    with ExitStack() as stack:  # every output renamed into place only once all are written
        for path, frame in frames:
            frame.write_parquet(stack.enter_context(atomic_path(path)))
    return [path for path, _ in frames]
