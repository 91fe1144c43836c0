"""Saving models sparse: safetensors with values plus a bitmap or indices per tensor.

Each tensor is stored in whichever of three layouts is smallest on disk:

* ``dense``:  ``<name>`` the full tensor;
* ``bitmap``: ``<name>::values`` ``(nnz,)`` and ``<name>::bitmap`` packed bits ``(ceil(numel/8),)``
  uint8 (numpy ``packbits`` order);
* ``coo``:    ``<name>::values`` ``(nnz,)`` and ``<name>::indices`` ``(nnz,)`` int32 flat
  positions (int64 when ``numel >= 2**31``).

The layout and shape of each tensor are recorded in the safetensors metadata, so
:func:`load_sparse` rebuilds exactly the saved tensors (identical values, hence identical
predictions).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from fedcomm.atomic import atomic_path
from fedcomm.types import ParamDict


def _layouts(t: Tensor) -> tuple[str, dict[str, Tensor]]:
    flat = t.detach().contiguous().reshape(-1).cpu()
    numel = flat.numel()
    positions = torch.nonzero(flat, as_tuple=False).reshape(-1)
    nnz = positions.numel()
    value_bytes = flat.element_size()
    idx_dtype = torch.int32 if numel < 2**31 else torch.int64
    sizes = {
        "dense": numel * value_bytes,
        "bitmap": nnz * value_bytes + (numel + 7) // 8,
        "coo": nnz * (value_bytes + (4 if idx_dtype == torch.int32 else 8)),
    }
    best = min(sizes, key=lambda k: (sizes[k], k != "dense"))
    if best == "dense":
        return "dense", {"": flat.reshape(t.shape).clone()}
    values = flat[positions].clone()
    if best == "bitmap":
        bitmap = np.packbits((flat != 0).numpy().astype(np.uint8))
        return "bitmap", {"::values": values, "::bitmap": torch.from_numpy(bitmap)}
    return "coo", {"::values": values, "::indices": positions.to(idx_dtype)}


def save_sparse(params: Mapping[str, Tensor], path: Path) -> dict[str, str]:
    """Write ``params`` to ``path`` (atomically); returns the layout chosen per tensor."""
    tensors: dict[str, Tensor] = {}
    layout: dict[str, dict[str, object]] = {}
    for name, t in params.items():
        kind, parts = _layouts(t)
        layout[name] = {"layout": kind, "shape": list(t.shape), "dtype": str(t.dtype)}
        for suffix, part in parts.items():
            tensors[name + suffix] = part
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata={"fedcomm.layout": json.dumps(layout)})
    return {k: str(v["layout"]) for k, v in layout.items()}


def load_sparse(path: Path) -> ParamDict:
    """Rebuild the dense tensors saved by :func:`save_sparse`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if "fedcomm.layout" not in meta:
        raise ValueError(f"{path}: not a fedcomm sparse model file (no layout metadata)")
    layout = json.loads(meta["fedcomm.layout"])
    stored = load_file(str(path))
    out: ParamDict = {}
    for name, info in layout.items():
        shape = tuple(info["shape"])
        if info["layout"] == "dense":
            out[name] = stored[name]
            continue
        values = stored[name + "::values"]
        numel = int(np.prod(shape)) if shape else 1
        flat = torch.zeros(numel, dtype=values.dtype, device="cpu")
        if info["layout"] == "bitmap":
            bits = np.unpackbits(stored[name + "::bitmap"].numpy(), count=numel).astype(bool)
            flat[torch.from_numpy(bits)] = values
        else:
            flat[stored[name + "::indices"].long()] = values
        out[name] = flat.reshape(shape)
    return out
