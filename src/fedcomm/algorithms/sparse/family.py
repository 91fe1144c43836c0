"""What the sparse-mask family shares beyond :mod:`.masks`: the config, model check and churn.

FedDST, RandomMask and GraSP share :class:`SparseConfig` (the target sparsity ``S``, the layer
budgets, the weighting of clients, the free initial download) and need a model with maskable
(Conv/Linear) weights: :func:`layers_of`. (PruneFL names its maskable weights as
``named_parameters`` does, so that a tied weight keeps its parameter's name:
:func:`fedcomm.algorithms.prunefl.times.maskable`.) FedDST and PruneFL both log how far a
readjustment moved the mask (the FedDST code's debug print, PruneFL's ``n_differences / N``):
:func:`churn`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

from pydantic import Field, model_validator
from torch import Tensor, nn

from fedcomm.algorithms.core.contract import AlgorithmConfig
from fedcomm.algorithms.sparse import masks as _masks
from fedcomm.algorithms.sparse.budgets import Distribution
from fedcomm.server_opt import ServerOptConfig


class SparseConfig(AlgorithmConfig):
    """Fields shared by the fixed- and dynamic-mask algorithms."""

    sparsity: float = Field(0.8, ge=0, lt=1, description="S: target sparsity of maskable weights")
    distribution: Distribution = Field(
        "official", description="layer budgets: the FedDST code's rule, RigL's ERK or uniform"
    )
    weighting: Literal["num_examples", "uniform"] = "num_examples"
    free_initial_download: bool = Field(
        True, description="round 1's values cost nothing (θ_0 is a seed); mask bits still paid"
    )

    @model_validator(mode="after")
    def _no_server_optimizer(self) -> SparseConfig:
        if self.server != ServerOptConfig():
            raise ValueError(
                f"{self.name} averages the kept weights directly and has no server optimizer; "
                "remove `server`"
            )
        return self


def churn(old: Mapping[str, Tensor], new: Mapping[str, Tensor]) -> float:
    """Fraction of maskable entries whose mask bit changed (Hamming distance / ``N_m``)."""
    return _masks.changed(old, new) / max(1, sum(m.numel() for m in new.values()))


def layers_of(model: nn.Module | None) -> tuple[_masks.MaskLayer, ...]:
    """The maskable layers of ``model`` (at least one; :func:`~.masks.maskable_layers`)."""
    if model is None:
        raise ValueError("sparse training needs the model structure in the round context")
    layers = _masks.maskable_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no Conv/Linear weights to mask")
    return layers


def validate_model(model: nn.Module) -> None:
    layers_of(model)
