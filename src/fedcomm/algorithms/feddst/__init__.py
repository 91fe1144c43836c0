"""FedDST (Bibikar et al.): federated dynamic sparse training, per-layer prune and regrow.

:mod:`.algorithm` is the paper's round (config, masked jobs, sparse weighted average); it composes
:mod:`.client` (the masked job, where a client readjusts, its upload), :mod:`.readjust` (Eq. 2's
annealed ratio, magnitude prune, gradient regrow) and :mod:`.comm` (the messages and their cost).
GraSP and RandomMask build on :func:`make`. Importing the package registers ``feddst``.
"""

from __future__ import annotations

from fedcomm.algorithms.feddst.algorithm import Config, ServerState, build, make
from fedcomm.algorithms.feddst.client import ClientState

__all__ = ["ClientState", "Config", "ServerState", "build", "make"]
