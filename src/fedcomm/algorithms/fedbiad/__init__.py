"""FedBIAD: Bayesian inference-based adaptive dropout of weight rows.

The paper's algorithm box is :mod:`.algorithm`; its helpers are the sibling modules. This
package re-exports the algorithm's public names, and importing it registers the algorithm.
"""

from __future__ import annotations

from fedcomm.algorithms.fedbiad.algorithm import (
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
