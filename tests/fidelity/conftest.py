"""Fixtures shared by the fidelity guards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def cifar_root(data_root: Path) -> Path:
    """The data root holding the CIFAR-10 JPEG copy (CI fails without it; elsewhere: skip)."""
    if not (data_root / "cifar10_jpeg").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{data_root / 'cifar10_jpeg'} is missing")  # CI runs the real data
        pytest.skip("the CIFAR-10 JPEG copy is not on this machine")
    return data_root
