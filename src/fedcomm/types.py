"""Shared vocabulary: a model's parameters as a dictionary (``ParamDict``)."""

from __future__ import annotations

from torch import Tensor

ParamDict = dict[str, Tensor]  # parameter name -> tensor (same names as model.named_parameters())
