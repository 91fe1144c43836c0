"""What every partitioning scheme shares: its error, result types, base class and registry."""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, ParamSpec, TypeVar, cast

import numpy as np

from fedcomm.data._registry import add_entry
from fedcomm.errors import InputError


class PartitionError(InputError, ValueError):
    """Invalid partition parameters, or a partition that cannot be built from this data."""


@dataclass(frozen=True)
class ClientSplits:
    """Each client's train and test rows, for a partitioner that chooses the test rows itself.

    Attributes:
        train: per client, sorted ``int64`` row indices; disjoint between clients.
        test: per client, sorted ``int64`` row indices, disjoint from every client's train
            rows. Test rows of different clients may overlap (``lotteryfl`` gives every holder
            of a class the same test rows of that class).
    """

    train: list[np.ndarray]
    test: list[np.ndarray]

    def __post_init__(self) -> None:
        if len(self.train) != len(self.test):
            raise PartitionError(
                f"{len(self.train)} train but {len(self.test)} test row sets: need one per client"
            )


_R = TypeVar("_R", list[np.ndarray], ClientSplits)


class Partitioner(ABC, Generic[_R]):
    """A partitioning scheme bound to one dataset's labels and its own random generator.

    A subclass checks every argument in ``__init__``, raising :class:`PartitionError` with a
    message naming the parameter, its value and what is allowed, and draws nothing there;
    :meth:`partition` then draws, from ``rng`` only (never NumPy's global state).

    Args:
        labels: ``(n,)`` the dataset's labels; must be a non-empty 1-D array.
        rng: the scheme's source of randomness.
    """

    def __init__(self, labels: np.ndarray, rng: np.random.Generator) -> None:
        arr = np.asarray(labels)
        if arr.ndim != 1 or len(arr) == 0:
            raise PartitionError(f"labels must be a non-empty 1-D array, got shape {arr.shape}")
        self.labels = arr
        self.rng = rng
        self._result: _R | None = None

    def partition(self) -> _R:
        """The partition, drawn from ``rng`` on the first call; later calls return the same.

        Returns:
            One sorted ``int64`` row-index array per partition, or :class:`ClientSplits` for
            a scheme that picks the test rows too.

        Raises:
            PartitionError: the draws cannot give a valid partition (see the scheme).
        """
        if self._result is None:
            self._result = self._draw()
        return self._result

    @abstractmethod
    def _draw(self) -> _R:
        """Draw the partition from ``self.rng``."""


PartitionFn = Callable[..., list[np.ndarray] | ClientSplits]
"""``fn(labels, *, num_partitions, rng, **params)``: one row array per client, or
:class:`ClientSplits` when the partitioner picks the clients' test rows too."""

PARTITIONERS: dict[str, PartitionFn] = {}
"""Registry: partition kind (``params.yaml`` ``partition.kind``) -> partition function."""

_F = TypeVar("_F", bound=PartitionFn)
_P = ParamSpec("_P")


def register(name: str) -> Callable[[_F], _F]:
    """Add a partition function to :data:`PARTITIONERS` under ``name``.

    Args:
        name: the partition kind, e.g. ``"dirichlet"``.

    Returns:
        A decorator that registers the function and returns it unchanged.
    """

    def decorator(fn: _F) -> _F:
        entry: PartitionFn = fn
        add_entry(PARTITIONERS, "partitioner", name, entry)
        return fn

    return decorator


def register_scheme(name: str, scheme: Callable[_P, Partitioner[_R]]) -> Callable[_P, _R]:
    """Register, under ``name``, the function that returns ``scheme(...).partition()``.

    The function takes exactly the constructor's parameters (its ``inspect.signature`` is
    the constructor's, which is what a partition spec's params are checked against) and is
    named ``name`` in the scheme's module.

    Args:
        name: the partition kind, e.g. ``"dirichlet"``; also the function's name.
        scheme: a :class:`Partitioner` subclass.

    Returns:
        The registered function.
    """

    def fn(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        return scheme(*args, **kwargs).partition()

    cls = cast("type[Partitioner[_R]]", scheme)
    returns = inspect.signature(cls._draw).return_annotation
    signature = inspect.signature(cls).replace(return_annotation=returns)
    fn.__signature__ = signature  # type: ignore[attr-defined]
    fn.__name__ = fn.__qualname__ = name
    fn.__module__ = cls.__module__
    fn.__doc__ = f"""Partition by :class:`{cls.__qualname__}` (same arguments): its
    :meth:`~Partitioner.partition`, one sorted ``int64`` row-index array per partition or,
    for a scheme that picks the test rows too, :class:`ClientSplits`."""
    return register(name)(fn)
