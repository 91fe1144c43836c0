"""FedSparse: federated spike-and-slab sparsity over groups, trained by hard EM.

The paper's algorithm box is :mod:`.algorithm`; its helpers are the sibling modules. This
package re-exports the algorithm's public names, and importing it registers the algorithm.
"""

from __future__ import annotations

from fedcomm.algorithms.fedsparse.algorithm import (
    Config,
    ServerState,
    build,
    make,
)

__all__ = [
    "Config",
    "ServerState",
    "build",
    "make",
]
