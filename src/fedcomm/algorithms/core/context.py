"""What an algorithm's functions are given and return: the data, the contexts, the results.

The lowest module of :mod:`fedcomm.algorithms.core` (only the step rule's ``LocalConfig`` below
it), so the local-training executor (:mod:`.jobs`) and the contract (:mod:`.contract`) can both
use these types without importing each other; :mod:`fedcomm.algorithms.core` re-exports them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from fedcomm.algorithms.core.sgd import LocalConfig
from fedcomm.comm.ledger import Direction
from fedcomm.comm.payload import Payload
from fedcomm.types import ParamDict

ClientState = Any


@dataclass(frozen=True)
class ClientData:
    """One client's pre-tensorised split: ``x`` ``(n, ...)``, ``y`` ``(n,)`` or ``(n, T)``."""

    x: Tensor
    y: Tensor

    @property
    def num_examples(self) -> int:
        return int(self.x.shape[0])


@dataclass(frozen=True)
class RoundContext:
    """What every server-side function of a round may know: the round, a generator for it, and
    the run's seed (to derive replayable per-client streams with :mod:`fedcomm.seeding`)."""

    round_: int
    generator: torch.Generator
    seed: int = 0
    model: nn.Module | None = None  # structure only (e.g. for models.groups); never trained


@dataclass(frozen=True)
class ClientContext:
    """A client's view of the round: the reused model structure, local hyper-parameters and its
    own generator, seeded by ``(seed, round, client_id)``."""

    round_: int
    client_id: int
    model: nn.Module  # structure only: parameters are passed explicitly (torch.func style)
    local: LocalConfig
    generator: torch.Generator
    seed: int = 0  # the run's seed: shared streams the server can replay (Stream.ALGORITHM)


@dataclass(frozen=True)
class WarmStartContext:
    """What ``warm_start`` may use before round 1: a generator ``(seed, SERVER, 0)``, the run's
    seed, the model structure and the local hyper-parameters."""

    generator: torch.Generator
    seed: int
    model: nn.Module
    local: LocalConfig


Message = tuple[int, Direction, Payload]  # (client_id, "up" | "down", payload)


@dataclass(frozen=True)
class ClientResult:
    """What ``client_update`` returns."""

    uplink: Payload
    state: ClientState
    local_params: ParamDict  # the model the client ends the round with (its "last upload")
    num_examples: int
    # e.g. {"train/loss": ..., "fedsparse/tv_mean": ..., "fedsparse/tv_max": ...}; the loop logs the
    # mean over the round's clients, the max for keys ending in "_max", the min for "_min"
    metrics: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Uplink:
    """A decoded uplink as the server sees it."""

    client_id: int
    num_examples: int
    tensors: Mapping[str, Tensor]
