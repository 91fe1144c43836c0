"""PruneFL (Jiang et al.): adaptive unstructured pruning, first on one client, then federated.

:mod:`.algorithm` is the paper's two phases (config, phase one, the federated rounds); it composes
:mod:`.client` (messages and masked local training), :mod:`.readjust` (which entries stay, when,
and with what ``p``) and :mod:`.times` (maskable layers and the per-entry times the readjustment
weighs). Importing the package registers ``prunefl``.
"""

from __future__ import annotations

from fedcomm.algorithms.prunefl.algorithm import Config, ServerState, build, make
from fedcomm.algorithms.prunefl.client import ClientState

__all__ = ["ClientState", "Config", "ServerState", "build", "make"]
