"""Seeds of one configuration pooled: the mean and standard error of every number of their run
summaries."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def _is_number(value: Any) -> bool:
    """True for ints and finite-or-infinite floats that are not NaN and not bools."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return not math.isnan(value)


def mean_se(values: Sequence[float]) -> dict[str, float | int | None]:
    """Mean and standard error (``stdev(ddof=1) / sqrt(n)``; 0 for one value)."""
    n = len(values)
    if n == 0:
        return {"mean": None, "se": None, "n": 0}
    se = statistics.stdev(values) / math.sqrt(n) if n > 1 else 0.0
    return {"mean": statistics.fmean(values), "se": se, "n": n}


def _aggregate(nodes: Sequence[Any]) -> Any:
    """Aggregate one position of several summaries: recurse into dicts, reduce leaves."""
    dicts = [node for node in nodes if isinstance(node, Mapping)]
    if dicts:
        keys = list(dict.fromkeys(k for d in dicts for k in d))
        return {k: _aggregate([d.get(k) for d in dicts]) for k in keys}
    return mean_se([float(v) for v in nodes if _is_number(v)])


def aggregate_seeds(summaries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Mean and standard error over seeds of every numeric leaf of :func:`summarize_run` output.

    Each leaf becomes ``{"mean", "se", "n"}``: ``n`` counts the seeds where it is a number
    (nulls, e.g. a target one seed never reached, are left out), ``se = stdev / sqrt(n)``
    with ``ddof=1``, and 0 when ``n == 1``.

    Args:
        summaries: one summary per seed.

    Returns:
        The same nesting with aggregated leaves.
    """
    out = _aggregate(list(summaries))
    return out if isinstance(out, dict) else {}
