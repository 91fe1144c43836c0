"""The reader of a loader's options (``data.dataset`` keys besides ``name`` and ``root``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


class Options:
    """Typed access to a loader's options; rejects unknown names and ill-typed values."""

    def __init__(self, dataset: str, options: Mapping[str, Any], allowed: Sequence[str]) -> None:
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(f"dataset {dataset!r}: unknown options {unknown}; allowed {allowed}")
        self.dataset, self.options = dataset, options

    def _bad(self, key: str, want: str) -> ValueError:
        return ValueError(f"dataset {self.dataset!r}: option {key}={self.options[key]!r}: {want}")

    def flag(self, key: str, default: bool) -> bool:
        v = self.options.get(key, default)
        if not isinstance(v, bool | np.bool_):
            raise self._bad(key, "expected a bool")
        return bool(v)

    def integer(self, key: str, default: int, minimum: int) -> int:
        v = self.optional_integer(key, minimum, default)
        if v is None:
            raise self._bad(key, f"expected an integer >= {minimum}")
        return v

    def optional_integer(self, key: str, minimum: int, default: int | None = None) -> int | None:
        v = self.options.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < minimum:
            raise self._bad(key, f"expected an integer >= {minimum}")
        return int(v)

    def number(self, key: str, default: float, minimum: float) -> float:
        v = self.options.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float | np.number) or not v >= minimum:
            raise self._bad(key, f"expected a number >= {minimum}")
        return float(v)

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        v = self.options.get(key, default)
        if v not in choices:
            raise self._bad(key, f"expected one of {list(choices)}")
        return str(v)

    def required_string(self, key: str, example: str) -> str:
        if key not in self.options:
            raise ValueError(f"dataset {self.dataset!r}: option {key} is required (e.g. {example})")
        v = self.options[key]
        if not isinstance(v, str) or not v:
            raise self._bad(key, f"expected a non-empty string (e.g. {example})")
        return v
