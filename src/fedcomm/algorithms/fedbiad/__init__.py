"""FedBIAD (Xue et al.): Bayesian inference-based adaptive dropout of weight rows.

:mod:`.algorithm` is the paper's Algorithm 1 (config, client and server rounds); it composes
:mod:`.rows` (which rows may drop, keep counts, the loss trend and row scores, stage two's top
rows), :mod:`.bayes` (the local variational objective, Eqs. 2-7 and 13) and :mod:`.server` (the
upload and Eq. 10's aggregation). Importing the package registers ``fedbiad``.
"""

from __future__ import annotations

from fedcomm.algorithms.fedbiad.algorithm import ClientState, Config, ServerState, build, make

__all__ = ["ClientState", "Config", "ServerState", "build", "make"]
