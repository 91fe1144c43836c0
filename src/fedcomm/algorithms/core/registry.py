"""The registry: each algorithm's config class and builder, by the config's ``name``.

An algorithm module registers itself with ``@register(Config)`` on its builder when it is
imported; :mod:`fedcomm.algorithms` imports every algorithm module and paper package, so the
params schema (:mod:`fedcomm.config`) and the contract tests see them all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fedcomm.algorithms.core.contract import AlgorithmConfig, FedAlgorithm

C = TypeVar("C", bound=AlgorithmConfig)
Builder = Callable[[Any], FedAlgorithm[Any]]

ALGORITHMS: dict[str, Builder] = {}
CONFIGS: dict[str, type[AlgorithmConfig]] = {}


def config_name(config_cls: type[AlgorithmConfig]) -> str:
    """The ``name`` literal of an algorithm config class."""
    field_info = config_cls.model_fields["name"]
    args: tuple[object, ...] = getattr(field_info.annotation, "__args__", ())
    name = args[0] if len(args) == 1 else None
    if not isinstance(name, str):
        raise TypeError(f"{config_cls.__name__}.name must be Literal['<one name>']")
    return name


def register(
    config_cls: type[C],
) -> Callable[[Callable[[C], FedAlgorithm[Any]]], Callable[[C], FedAlgorithm[Any]]]:
    """Register ``build(cfg) -> FedAlgorithm`` for the algorithm named by ``config_cls``."""
    name = config_name(config_cls)

    def deco(build: Callable[[C], FedAlgorithm[Any]]) -> Callable[[C], FedAlgorithm[Any]]:
        if name in ALGORITHMS:
            raise ValueError(f"algorithm {name!r} registered twice")
        ALGORITHMS[name] = build
        CONFIGS[name] = config_cls
        return build

    return deco


def build_algorithm(cfg: AlgorithmConfig) -> FedAlgorithm[Any]:
    """The algorithm for a validated config."""
    try:
        build = ALGORITHMS[cfg.name]
    except KeyError:
        raise ValueError(
            f"unknown algorithm {cfg.name!r}; registered: {sorted(ALGORITHMS)}"
        ) from None
    return build(cfg)
