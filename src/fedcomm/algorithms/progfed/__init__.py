"""ProgFed: progressive training of a model split into S stages (specs/feddst-progfed.md §2).

The paper's algorithm box is :mod:`.algorithm`; its helpers are the sibling modules. This
package re-exports the algorithm's public names, and importing it registers the algorithm.
"""

from __future__ import annotations

from fedcomm.algorithms.progfed.algorithm import (
    Config,
    ServerState,
    build,
)

__all__ = [
    "Config",
    "ServerState",
    "build",
]
