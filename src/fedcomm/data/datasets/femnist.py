"""``femnist``: LEAF's FEMNIST shards, one natural client per writer.

Writers are numbered by first appearance over the sorted train files, then the test files.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedcomm.data.datasets.leaf import find_leaf, iter_leaf_users
from fedcomm.data.datasets.options import Options
from fedcomm.data.datasets.registry import register
from fedcomm.data.datasets.verify import not_found
from fedcomm.data.types import Dataset


def _femnist_user(uid: str, rec: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """One FEMNIST writer's x ``(n, 1, 28, 28)`` float32 and y ``(n,)`` int64."""
    try:
        x = np.asarray(rec["x"], dtype=np.float32)  # (n_u, 784)
        y = np.asarray(rec["y"], dtype=np.int64)  # (n_u,)
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"user {uid!r}: needs 'x' and 'y' lists of numbers ({err!r})") from err
    if x.ndim != 2 or x.shape[1] != 784 or y.shape != (len(x),):
        raise ValueError(f"user {uid!r}: x {x.shape}, y {y.shape}; expected (n, 784) and (n,)")
    if y.size and not 0 <= y.min() <= y.max() <= 61:
        raise ValueError(f"user {uid!r}: labels outside 0..61")
    return x.reshape(-1, 1, 28, 28), y


@register("femnist")
def _load_femnist(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """FEMNIST (LEAF): x ``(n, 1, 28, 28)`` float32, 62 classes, one natural client per writer.

    LEAF stores white background (1.0); ``invert=True`` returns ``1 - x`` (background 0, as MNIST).
    """
    invert = Options("femnist", options, ("invert",)).flag("invert", False)
    found = find_leaf(root, ("leaf/femnist", "femnist"))
    if found is None:
        wanted = [f"leaf/femnist/{s}/<LEAF shard>.json.gz" for s in ("train", "test")]
        raise not_found("femnist", root, wanted, " (also accepted: femnist/{train,test}/*.json)")
    writers: dict[str, int] = {}
    xs, ys, ids = [], [], []
    release = "the LEAF FEMNIST shard, or remove it"
    for uid, (x, y) in iter_leaf_users([*found[0], *found[1]], release, _femnist_user):
        xs.append(x)
        ys.append(y)
        ids.append(np.full(len(y), writers.setdefault(uid, len(writers)), dtype=np.int64))
    x_all, y_all = np.concatenate(xs), np.concatenate(ys)
    if invert:
        x_all = 1.0 - x_all
    return Dataset(
        "femnist", x_all, y_all, 62, "classification", np.concatenate(ids), tuple(writers)
    )
