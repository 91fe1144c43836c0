"""The model registry: factories by name, and the one entry point that builds them.

A factory is a function taking keyword-only ``input_shape`` and ``num_classes`` plus its own
keyword options, and returning a freshly initialised ``nn.Module`` (seed with
``torch.manual_seed`` first for a deterministic init). Every registered model keeps all of its
state in parameters (no buffers, no BatchNorm), so ``torch.func.functional_call(model, params,
x)`` covers everything the model holds.

Example:
    >>> model = build_model("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=[128])
    >>> num_parameters(model)
    101770
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from fedcomm.seeding import Stream, torch_generator

ModelFactory = Callable[..., nn.Module]

MODELS: dict[str, ModelFactory] = {}

_REQUIRED = ("input_shape", "num_classes")


def register(name: str) -> Callable[[ModelFactory], ModelFactory]:
    """Decorator adding a model factory to ``MODELS`` under ``name``.

    Args:
        name: registry key, e.g. ``"cnn"``; must be new.

    Returns:
        The decorator; it returns the factory unchanged.
    """

    def decorator(factory: ModelFactory) -> ModelFactory:
        if name in MODELS:
            raise ValueError(f"model {name!r} is already registered")
        params = inspect.signature(factory).parameters
        missing = [p for p in _REQUIRED if p not in params]
        if missing:
            raise TypeError(f"model factory {name!r} lacks keyword arguments {missing}")
        MODELS[name] = factory
        return factory

    return decorator


def option_names(name: str) -> tuple[str, ...]:
    """The options (keyword arguments besides input_shape/num_classes) model ``name`` accepts."""
    params = inspect.signature(_factory(name)).parameters
    return tuple(p for p in params if p not in _REQUIRED)


def build_model(
    name: str, *, input_shape: tuple[int, ...], num_classes: int, **options: Any
) -> nn.Module:
    """Build registered model ``name``.

    Args:
        name: registry key (see ``MODELS``).
        input_shape: one example's shape, without the batch dim: ``(C, H, W)`` for images,
            ``(d,)`` for tabular data, ``(T,)`` for token sequences.
        num_classes: number of classes (the vocabulary size for language models).
        **options: model-specific options, e.g. ``hidden=[128]`` for ``mlp``.

    Returns:
        A freshly initialised model.

    Raises:
        ValueError: unknown model name, unknown option, or an invalid option value.
    """
    factory = _factory(name)
    unknown = sorted(set(options) - set(option_names(name)))
    if unknown:
        raise ValueError(
            f"model {name!r}: unknown option(s) {unknown}; accepted: {list(option_names(name))}"
        )
    if num_classes < 1:
        raise ValueError(f"model {name!r}: num_classes must be >= 1, got {num_classes}")
    input_shape = tuple(int(s) for s in input_shape)
    if not input_shape or min(input_shape) < 1:
        raise ValueError(f"model {name!r}: input_shape must be non-empty and positive")
    return factory(input_shape=input_shape, num_classes=num_classes, **options)


def build_seeded_model(
    name: str, seed: int, *, input_shape: tuple[int, ...], num_classes: int, **options: Any
) -> nn.Module:
    """:func:`build_model`, initialised as a run's model is: torch's global RNG is seeded from
    the run's ``(seed, INIT)`` stream first (and left so; wrap the call in
    ``torch.random.fork_rng`` to keep the caller's). The train stage's model, the evaluate
    stage's and ``fedcomm.load_model``'s are this one."""
    gen = torch_generator(seed, Stream.INIT)
    torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=gen, device=gen.device)))
    return build_model(name, input_shape=input_shape, num_classes=num_classes, **options)


def num_parameters(model: nn.Module) -> int:
    """Number of scalar parameters (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters())


def invalid_option(model: str, option: str, problem: str) -> ValueError:
    """The error factories raise for a bad option value, naming the model and the option."""
    return ValueError(f"model {model!r}: {option!r} {problem}")


def positive_int(model: str, option: str, value: int) -> int:
    """``value`` if it is a positive int (bools rejected), else ``invalid_option``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise invalid_option(model, option, f"must be a positive int, got {value!r}")
    return value


def positive_ints(
    model: str,
    option: str,
    values: Sequence[int],
    *,
    length: int | None = None,
    allow_empty: bool = False,
) -> list[int]:
    """``values`` as a list if it is a sequence of positive ints of the right length."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise invalid_option(model, option, f"must be a sequence of ints, got {values!r}")
    for v in values:
        positive_int(model, option, v)
    if length is not None and len(values) != length:
        raise invalid_option(model, option, f"must have {length} entries, got {len(values)}")
    if not values and not allow_empty:
        raise invalid_option(model, option, "must not be empty")
    return list(values)


def _factory(name: str) -> ModelFactory:
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; registered: {sorted(MODELS)}")
    return MODELS[name]
