"""The one way a name -> object registry of this package (datasets, partitioners) takes entries."""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import TypeVar

_T = TypeVar("_T")


def add_entry(registry: MutableMapping[str, _T], what: str, name: str, item: _T) -> None:
    """Store ``item`` under ``name``; a name is registered once.

    Args:
        registry: the registry, e.g. :data:`~fedcomm.data.datasets.registry.DATASETS`.
        what: what it holds, for the error message (``"dataset"``).
        name: the key.
        item: the value.

    Raises:
        ValueError: ``name`` is already registered.
    """
    if name in registry:
        raise ValueError(f"{what} {name!r} is already registered")
    registry[name] = item
