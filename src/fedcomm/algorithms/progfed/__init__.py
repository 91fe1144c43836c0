"""ProgFed (Wang et al.): progressive training of a model split into S stages.

:mod:`.algorithm` is the paper's Algorithm 1 (config, rounds, server step); it composes
:mod:`.schedule` (the stage schedule and client learning rate), :mod:`.model` (the progressive net
and its temporary heads), :mod:`.client` (local SGD on the active sub-model) and :mod:`.charge`
(what each round is charged). Importing the package registers ``progfed``.
"""

from __future__ import annotations

from fedcomm.algorithms.progfed.algorithm import Config, ServerState, build

__all__ = ["Config", "ServerState", "build"]
