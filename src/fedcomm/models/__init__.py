"""Models by name, each exposing its prunable groups (FedSparse) and rows (FedBIAD) uniformly.

Example:
    >>> from fedcomm.models import build_model, groups
    >>> model = build_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    >>> [(g.name, g.count) for g in groups(model)]
    [('conv1', 32), ('conv2', 64), ('fc1', 1600), ('fc2', 512)]
"""

from fedcomm.models import lstm, progfed_nets, resnet, vision  # noqa: F401  (registers the models)
from fedcomm.models.groups import (
    GroupSpec,
    apply_mask,
    expand_mask,
    group_norms,
    group_sizes,
    groups,
    rows,
    ungrouped,
)
from fedcomm.models.progressive import (
    ProgressiveNet,
    Staged,
    Unit,
    dense_numel,
    is_staged,
    structure_for,
)
from fedcomm.models.registry import (
    MODELS,
    ModelFactory,
    build_model,
    build_seeded_model,
    num_parameters,
    option_names,
    register,
)

__all__ = [
    "MODELS",
    "GroupSpec",
    "ModelFactory",
    "ProgressiveNet",
    "Staged",
    "Unit",
    "apply_mask",
    "build_model",
    "build_seeded_model",
    "dense_numel",
    "expand_mask",
    "group_norms",
    "group_sizes",
    "groups",
    "is_staged",
    "num_parameters",
    "option_names",
    "register",
    "rows",
    "structure_for",
    "ungrouped",
]
