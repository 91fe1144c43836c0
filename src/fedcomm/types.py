"""Shared vocabulary: parameter dictionaries and small aliases."""

from __future__ import annotations

from typing import Literal

from torch import Tensor

Params = dict[str, Tensor]  # parameter name -> tensor (same names as model.named_parameters())
Direction = Literal["down", "up"]
