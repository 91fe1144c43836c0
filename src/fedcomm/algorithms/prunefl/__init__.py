"""PruneFL: adaptive unstructured pruning, first on one client, then federated.

The paper's algorithm box is :mod:`.algorithm`; its helpers are the sibling modules. This
package re-exports the algorithm's public names, and importing it registers the algorithm.
"""

from __future__ import annotations

from fedcomm.algorithms.prunefl.algorithm import (
    Config,
    ServerState,
    build,
    make,
)
from fedcomm.algorithms.prunefl.client import ClientState

__all__ = [
    "ClientState",
    "Config",
    "ServerState",
    "build",
    "make",
]
