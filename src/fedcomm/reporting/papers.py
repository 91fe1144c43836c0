"""The four papers the registry reproduces (the claims' ``paper`` key)."""

from __future__ import annotations

from typing import Literal, get_args

Paper = Literal["FedBIAD", "FedSparse", "FedDST", "ProgFed"]
PAPERS: tuple[str, ...] = get_args(Paper)
