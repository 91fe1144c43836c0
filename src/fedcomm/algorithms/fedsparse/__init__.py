"""FedSparse (Louizos et al.): federated spike-and-slab sparsity over groups, by hard EM.

:mod:`.algorithm` is the paper's Algorithms 1-2 (config, server step, client round); it composes
:mod:`.gates` (θ, π and the hard-concrete relaxation), :mod:`.penalties` (the objective's L0,
prior and drift terms), :mod:`.local` (the local step as a job), :mod:`.server` (pruning and the
M-step's metrics) and :mod:`.messages` (what goes down and up, and its bits). Importing the
package registers ``fedsparse``.
"""

from __future__ import annotations

from fedcomm.algorithms.fedsparse.algorithm import Config, ServerState, build, make

__all__ = ["Config", "ServerState", "build", "make"]
