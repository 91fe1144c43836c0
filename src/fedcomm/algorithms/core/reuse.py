"""Work every client of a round would repeat, done once.

The clients of a round receive the same downlink: the same server state, encoded into the same
payload, decoded into the same tensor objects. What an algorithm derives from them (the payload
itself, the decoded model and masks, a mask set's digest) is the same for all of them, so it is
made for the first client and reused while the same objects come again.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class Reused(Generic[T]):
    """The last value made from some objects, reused while the same objects come again.

    Objects are compared by identity (``is``: tensors have no usable equality) and kept alive by
    the cache, so an identity cannot be reused by a new object; ``also`` is compared by equality
    (e.g. the round number)."""

    def __init__(self) -> None:
        self._key: list[object] = []
        self._also: Hashable = None
        self._value: T | None = None
        self._made = False

    def get(self, objects: Sequence[object], make: Callable[[], T], also: Hashable = None) -> T:
        same = (
            self._made
            and also == self._also
            and len(objects) == len(self._key)
            and all(a is b for a, b in zip(objects, self._key, strict=True))
        )
        if not same:
            self._key, self._also, self._value, self._made = list(objects), also, make(), True
        return self._value  # type: ignore[return-value]
