"""``digits``: scikit-learn's bundled 8x8 digits (no files under the data root)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedcomm.data.datasets.options import Options
from fedcomm.data.datasets.registry import register
from fedcomm.data.types import Dataset


@register("digits")
def _load_digits(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """scikit-learn's 1,797 8x8 digits: x ``(n, 1, 8, 8)`` in [0, 1], 10 classes."""
    from sklearn.datasets import load_digits

    Options("digits", options, ())
    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / 16.0)[:, None]  # (n, 1, 8, 8)
    return Dataset("digits", x, np.asarray(bunch.target, dtype=np.int64), num_classes=10)
