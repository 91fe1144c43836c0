"""A trained run's model rebuilt from what its config and dataset say, its saved tensors in place
(``fedcomm.load_model``'s second half; :mod:`fedcomm.tracking.saved_model` finds the model file
and the config).

The architecture is the registry's model as the train stage initialised it (the run's ``model``
section and ``seed``, with one example's shape and the number of classes of its dataset), in the
structure its algorithm trains (ProgFed's progressive net); the saved tensors are loaded into it,
an ensemble's (``fedavg_mog``) into one copy per member. No MLflow and no params schema here: the
caller passes the config's parts as a :class:`RunSpec`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor, nn

from fedcomm.errors import InputError, one_line
from fedcomm.evaluation.metrics import ensemble_log_probs
from fedcomm.run_files import misfit

if TYPE_CHECKING:  # (importing fedcomm.algorithms registers every algorithm: on first use only)
    from fedcomm.algorithms.core import AlgorithmConfig


class ModelLoadError(InputError, ValueError):
    """What :func:`~fedcomm.tracking.saved_model.load_model` needs is missing or does not fit;
    the one-line message names it and how to pass it."""


@dataclass(frozen=True)
class RunSpec:
    """What the architecture needs from a run's config."""

    model: str  # model.name
    model_options: dict[str, Any]  # the model section's other keys
    algorithm: AlgorithmConfig
    dataset: str  # data.dataset.name
    dataset_options: dict[str, Any]  # data.dataset's other keys
    seed: int


class Ensemble(nn.Module):
    """An ensemble's members (``fedavg_mog``) as one model: the log of the members' mean softmax,
    which is what the evaluation scores (its arg-max is the ensemble's prediction)."""

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, x: Tensor) -> Tensor:
        return ensemble_log_probs([m(x) for m in self.members])


def data_shape(spec: RunSpec, root: str | Path | None, where: str) -> tuple[tuple[int, ...], int]:
    """One example's shape and the number of classes of the run's dataset (read once)."""
    from fedcomm.data.datasets.registry import load_dataset

    try:
        ds = load_dataset(spec.dataset, root, **spec.dataset_options)
    except (InputError, ValueError) as err:
        raise ModelLoadError(
            f"{where}: the model's input shape and classes come from dataset {spec.dataset!r}, "
            f"which could not be read ({one_line(err)}); pass data_root= (or set "
            "FEDCOMM_DATA_ROOT), or input_shape= and num_classes="
        ) from None
    return ds.input_shape, ds.num_classes


def rebuild(
    spec: RunSpec,
    tensors: Mapping[str, Tensor],
    input_shape: tuple[int, ...],
    num_classes: int,
    where: str,
) -> nn.Module:
    """The run's model with ``tensors`` (a model file's, every ensemble member's) loaded: the
    plain architecture once ProgFed's final stage is reached, an :class:`Ensemble` of the
    members for an ensemble. ``where`` names the source in messages."""
    from fedcomm.algorithms.core import split_members

    model = architecture(spec, input_shape, num_classes, where)
    members = split_members(tensors)
    loaded = [
        load_into(model if len(members) == 1 else copy.deepcopy(model), m, where) for m in members
    ]
    return loaded[0] if len(loaded) == 1 else Ensemble(loaded)


def architecture(
    spec: RunSpec, input_shape: tuple[int, ...], num_classes: int, where: str
) -> nn.Module:
    """The model as the train stage initialised it (the ``(seed, INIT)`` stream; the global RNG
    is left as it was), in the structure the algorithm trains (ProgFed's progressive net)."""
    from fedcomm.models import build_seeded_model

    fit = f"(inputs {input_shape}, {num_classes} classes)"
    with torch.random.fork_rng(devices=[]):
        try:
            model = build_seeded_model(
                spec.model,
                spec.seed,
                input_shape=input_shape,
                num_classes=num_classes,
                **spec.model_options,
            )
        except ValueError as err:
            raise ModelLoadError(f"{where}: model {spec.model!r} {fit}: {err}") from None
    return trained_structure(model, spec.algorithm, spec.seed)


def trained_structure(model: nn.Module, algorithm: AlgorithmConfig, seed: int) -> nn.Module:
    """``model`` in the structure ``algorithm`` trains and saves (ProgFed's progressive net with
    its heads: its ``prepare_model``), else ``model`` itself."""
    from fedcomm.algorithms import build_algorithm

    prepare = build_algorithm(algorithm).prepare_model
    return model if prepare is None else prepare(model, seed)


def load_into(model: nn.Module, tensors: Mapping[str, Tensor], where: str) -> nn.Module:
    """``model`` (or the sub-model ``tensors`` describe) with ``tensors`` loaded."""
    from fedcomm.models import ProgressiveNet, structure_for

    try:
        target = structure_for(model, tensors)
    except ValueError as err:
        raise ModelLoadError(f"{where}: {err}") from None
    problem = misfit(
        tensors,
        target.state_dict(),
        "the run's model",
        lacks=" (pass the params it was trained with)",
        shape=" (check input_shape= / num_classes= / params=)",
    )
    if problem is not None:
        raise ModelLoadError(f"{where}: {problem}")
    # tensors a run does not save keep the seeded initialisation, as in its evaluation
    target.load_state_dict(dict(tensors), strict=False)
    if isinstance(target, ProgressiveNet):  # the final stage: the plain architecture
        return cast(nn.Module, target.base)
    return target
