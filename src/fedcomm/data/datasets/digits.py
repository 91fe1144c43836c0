"""``digits``: scikit-learn's bundled 8x8 digits (no files under the data root).

The file is read from scikit-learn's installed package data (``sklearn/datasets/data/
digits.csv.gz``, what ``sklearn.datasets.load_digits`` reads) without importing scikit-learn:
its import costs about a second, paid by every DVC stage of the default experiment otherwise.
"""

from __future__ import annotations

import gzip
import importlib.util
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
    Options("digits", options, ())
    with gzip.open(digits_file(), "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.float64)  # (1797, 65): 64 pixels, label
    x = (table[:, :-1].reshape(-1, 8, 8).astype(np.float32) / 16.0)[:, None]  # (n, 1, 8, 8)
    return Dataset("digits", x, table[:, -1].astype(np.int64), num_classes=10)


def digits_file() -> Path:
    """scikit-learn's ``digits.csv.gz``, found without importing scikit-learn."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("scikit-learn is not installed (digits ships with it)")
    return Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
