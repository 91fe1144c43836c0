"""FedDST: federated dynamic sparse training with per-layer magnitude prune / gradient regrow.

The paper's algorithm box is :mod:`.algorithm`; its helpers are the sibling modules. This
package re-exports the algorithm's public names, and importing it registers the algorithm.
"""

from __future__ import annotations

from fedcomm.algorithms.feddst.algorithm import (
    ClientState,
    Config,
    ServerState,
    build,
    make,
)

__all__ = [
    "ClientState",
    "Config",
    "ServerState",
    "build",
    "make",
]
