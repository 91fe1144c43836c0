"""fedcomm: a declarative, reproducible lab for communication-efficient federated learning.

``import fedcomm`` stays cheap (no torch, no MLflow). :func:`fedcomm.load_model` (a trained run's
model, :mod:`fedcomm.tracking.saved_model`) and ``fedcomm.ModelLoadError`` are imported on first
use: a convenience for users, by name only, so the package root stays the bottom layer
(docs/architecture.md).
"""

TYPE_CHECKING = False  # (typing's own would import typing: several times this module's cost)
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"

__all__ = ["ModelLoadError", "__version__", "load_model"]

_LAZY = {
    "load_model": "fedcomm.tracking.saved_model",
    "ModelLoadError": "fedcomm.tracking.saved_model",
}


def __getattr__(name: str) -> "Any":
    """``fedcomm.load_model`` and ``fedcomm.ModelLoadError``, imported on first access."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'fedcomm' has no attribute {name!r}")
