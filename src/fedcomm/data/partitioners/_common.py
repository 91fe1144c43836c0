"""Argument checks and building blocks that several partitioning schemes use."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedcomm.data.partitioners.base import PartitionError

_PACKAGE_DIR = Path(__file__).parent

# --- argument checks ----------------------------------------------------------------------


def check_int(name: str, value: Any, *, low: int, high: int | None = None) -> int:
    """Return ``value`` as an int if it is an integer in ``[low, high]``, else raise."""
    allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
    is_int = isinstance(value, int | np.integer) and not isinstance(value, bool)
    if not is_int or value < low or (high is not None and value > high):
        raise PartitionError(f"{name} must be an integer {allowed}, got {value!r}")
    return int(value)


def check_num_partitions(num_partitions: Any, num_rows: int) -> int:
    """``num_partitions`` as an int in ``[1, num_rows]``, else raise."""
    return check_int("num_partitions", num_partitions, low=1, high=num_rows)


# --- building blocks ----------------------------------------------------------------------


def group_by_owner(owner: np.ndarray, num_partitions: int) -> list[np.ndarray]:
    """Rows grouped by owning partition (``owner[row]``; ``-1`` = unassigned), sorted."""
    kept = np.flatnonzero(owner >= 0)
    order = kept[np.argsort(owner[kept], kind="stable")]  # stable: rows stay ascending
    counts = np.bincount(owner[kept], minlength=num_partitions)
    return [part.astype(np.int64) for part in np.split(order, np.cumsum(counts)[:-1])]


def sorted_parts(parts: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each part sorted, as ``int64``."""
    return [np.sort(part).astype(np.int64) for part in parts]


def round_to_total(
    quotas: np.ndarray, total: int, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Integers within 1 of ``quotas`` that sum to ``total`` (largest-remainder rounding).

    Each entry is ``floor(quota)`` or ``floor(quota) + 1``; the ``+1`` goes to the largest
    fractional parts, ties broken by ``rng`` (or by position when ``rng`` is None).
    """
    base = np.floor(quotas).astype(np.int64)
    remaining = max(total - int(base.sum()), 0)
    tiebreak = rng.random(len(quotas)) if rng is not None else np.zeros(len(quotas))
    order = np.lexsort((tiebreak, -(quotas - base)))
    base[order[:remaining]] += 1
    return base


def class_rows(labels: np.ndarray, rng: np.random.Generator, *, shuffle: bool) -> list[np.ndarray]:
    """Row indices of each class (sorted class order), permuted when ``shuffle``."""
    _, inverse = np.unique(labels, return_inverse=True)
    order = rng.permutation(len(labels)) if shuffle else np.arange(len(labels))
    grouped = order[np.argsort(inverse[order], kind="stable")]
    counts = np.bincount(inverse)
    return np.split(grouped, np.cumsum(counts)[:-1])


def warn_caller(message: str) -> None:
    """``warnings.warn(message)`` attributed to the nearest caller outside this package.

    A scheme is reached through its function or its class, at different stack depths; the
    warning should point at the user's line either way.
    """
    level = 2  # stacklevel 2 = our caller's frame
    frame = sys._getframe(1)
    while frame.f_back is not None and Path(frame.f_code.co_filename).parent == _PACKAGE_DIR:
        frame = frame.f_back
        level += 1
    warnings.warn(message, stacklevel=level)
