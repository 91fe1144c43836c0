"""RandomMask: FedDST's fixed-mask baseline (readjustment ratio α = 0).

Bibikar et al., "Federated Dynamic Sparse Training: Computing Less, Communicating Less, Yet
Learning Better", AAAI 2022 (arXiv:2112.09824), baseline "RandomMask" = the official code run
with ``--readjustment-ratio 0`` (bibikar/feddst @ 25d6184, ``README.md``). The mask is layer-wise
magnitude pruning of the random initial weights to the budgets ``k_l(S)`` and never changes;
local training, sparse averaging and communication are FedDST's (:mod:`.feddst`): each client
pays the ``N_m`` mask bits once, at its first download, then ``32·(d·N_m + B)`` bits each way.
"""

from __future__ import annotations

from typing import Literal

from fedcomm.algorithms import feddst
from fedcomm.algorithms.core import FedAlgorithm, register
from fedcomm.algorithms.sparse import SparseConfig


class Config(SparseConfig):
    name: Literal["randommask"] = "randommask"


@register(Config)
def build(cfg: Config) -> FedAlgorithm[feddst.ServerState]:
    return feddst.make(cfg, None)
