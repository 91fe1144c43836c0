"""The round's metrics that are reductions: its communication (from the bits the ledger
recorded), the clients' losses and algorithm metrics, the global model's density."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from fedcomm.comm import bits


def comm_metrics(
    up_bits: int,
    down_bits: int,
    up_dense_bits: float,
    cum_bits: int,
    cum_up_bits: int,
    numel: int,
    sampled: int,
) -> dict[str, float | None]:
    """The round's ``comm/*`` metrics: ``*_bits`` are the round's, ``cum_*`` the run's so far
    (this round included), ``numel`` the dense model's parameters, ``sampled`` the clients
    sampled in every round so far (each round's own cohort)."""
    dense_fedavg = 2 * bits.dense(numel) * sampled  # the model down and up per client sampled
    return {
        "comm/up_bytes": bits.to_bytes(up_bits),
        "comm/down_bytes": bits.to_bytes(down_bits),
        "comm/cum_bytes": bits.to_bytes(cum_bits),
        "comm/cum_gib": bits.to_gib(cum_bits),
        "comm/cum_up_bytes": bits.to_bytes(cum_up_bits),
        # dense models / sent bits, each uplink's dense model in proportion to what it sent
        "comm/up_ratio": up_dense_bits / up_bits if up_bits else None,
        # all bits so far / dense FedAvg's for the same clients (None: nobody sampled yet)
        "comm/cost_vs_dense": cum_bits / dense_fedavg if dense_fedavg else None,
    }


def density(params: Mapping[str, Tensor]) -> float:
    """The fraction of nonzero values in ``params`` (1 for no values)."""
    nnz = sum(int(torch.count_nonzero(v)) for v in params.values())
    numel = sum(v.numel() for v in params.values())
    return nnz / numel if numel else 1.0


def aggregate_client_metrics(per_client: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The round's value of each algorithm-specific client metric: max for ``*_max`` keys, min
    for ``*_min``, else the unweighted mean over clients (``train/loss`` is handled apart)."""
    keys = sorted({k for m in per_client for k in m} - {"train/loss"})
    out: dict[str, float] = {}
    for key in keys:
        values = [float(m[key]) for m in per_client if key in m and not math.isnan(float(m[key]))]
        if not values:
            continue
        if key.endswith("_max"):
            out[key] = max(values)
        elif key.endswith("_min"):
            out[key] = min(values)
        else:
            out[key] = float(np.mean(values))
    return out


def weighted(values: list[float], weights: list[int]) -> float | None:
    """The ``weights``-weighted mean of ``values``, NaNs and zero weights left out (None if
    nothing is left)."""
    pairs = [(v, w) for v, w in zip(values, weights, strict=True) if not math.isnan(v) and w > 0]
    if not pairs:
        return None
    return sum(v * w for v, w in pairs) / sum(w for _, w in pairs)
