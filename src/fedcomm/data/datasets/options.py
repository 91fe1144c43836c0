"""The reader of a loader's options (``data.dataset`` keys besides ``name`` and ``root``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

#: per-channel ``(mean, std)`` of the ``normalize`` option (one number per channel each)
ChannelStats = tuple[Sequence[float], Sequence[float]]


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

    def channel_stats(self, key: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
        """``{mean: [...], std: [...]}`` (one number per channel, every std > 0) or absent/null."""
        v = self.options.get(key)
        if v is None:
            return None
        want = "expected {mean: [m_1, ...], std: [s_1, ...]}, one number per channel, stds > 0"
        if not isinstance(v, Mapping) or set(v) != {"mean", "std"}:
            raise self._bad(key, want)
        stats = []
        for part in ("mean", "std"):
            seq = v[part]
            if isinstance(seq, str | bytes) or not isinstance(seq, Sequence) or not seq:
                raise self._bad(key, want)
            if not all(isinstance(n, int | float | np.number) and not isinstance(n, bool)
                       and np.isfinite(n) for n in seq):  # fmt: skip
                raise self._bad(key, want)
            stats.append(tuple(float(n) for n in seq))
        mean, std = stats
        if len(mean) != len(std) or min(std) <= 0:
            raise self._bad(key, want)
        return mean, std


def standardize(x: np.ndarray, stats: ChannelStats | None, dataset: str) -> np.ndarray:
    """``(x − mean_c) / std_c`` per channel of ``x (n, C, H, W)``, in place (torchvision's
    ``Normalize``); ``stats`` None: ``x`` unchanged. The channel counts must agree."""
    if stats is None:
        return x
    mean, std = stats
    if len(mean) != x.shape[1]:
        raise ValueError(
            f"dataset {dataset!r}: option normalize has {len(mean)} channels, the images "
            f"have {x.shape[1]}"
        )
    shape = (1, -1) + (1,) * (x.ndim - 2)
    x -= np.asarray(mean, np.float32).reshape(shape)
    x /= np.asarray(std, np.float32).reshape(shape)
    return x
