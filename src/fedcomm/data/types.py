"""The in-memory dataset every loader returns and every partitioner consumes."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

import numpy as np

Task = Literal["classification", "next_token"]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A pool of examples; partitioning splits it over clients and into train/test per client.

    Loaders pool the official train and test splits (when a dataset has both); each client's
    share is then split into train/test keeping its label distribution (see partitioners).

    Attributes:
        name: registry name, e.g. ``"mnist"``.
        x: inputs. Images: ``(n, C, H, W)`` float32 (already scaled); tabular: ``(n, d)``
            float32; text: ``(n, T)`` int64 token ids.
        y: targets. Classification: ``(n,)`` int64; next-token: ``(n, T)`` int64 (x shifted
            by one position) or ``(n,)`` for one next token per window.
        num_classes: number of classes, or the vocabulary size for next-token tasks.
        task: ``"classification"`` or ``"next_token"``.
        natural_id: ``(n,)`` int64 natural client of each example (FEMNIST writer,
            Shakespeare role) or ``None``.
        natural_names: the name behind each natural id (index = id), or ``None``.
        vocab: token strings for text datasets (index = id), else ``None``.
    """

    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    task: Task = "classification"
    natural_id: np.ndarray | None = None
    natural_names: tuple[str, ...] | None = None
    vocab: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.x) != len(self.y):
            raise ValueError(f"dataset {self.name!r}: x has {len(self.x)} rows, y {len(self.y)}")
        if self.natural_id is not None and len(self.natural_id) != len(self.x):
            raise ValueError(f"dataset {self.name!r}: natural_id length differs from x")

    def __len__(self) -> int:
        return len(self.x)

    @property
    def labels(self) -> np.ndarray:
        """``(n,)`` int64 label used for label-skew partitioning (last target for sequences)."""
        return self.y if self.y.ndim == 1 else self.y[:, -1]

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.x.shape[1:])

    def fingerprint(self) -> str:
        """Content hash of inputs and targets (sha256, hex); part of a partition's cache key."""
        h = hashlib.sha256()
        h.update(self.name.encode())
        for arr in (self.x, self.y, self.natural_id):
            if arr is None:
                h.update(b"none")
                continue
            a = np.ascontiguousarray(arr)
            h.update(str((a.dtype.str, a.shape)).encode())
            h.update(a.tobytes())
        return h.hexdigest()
