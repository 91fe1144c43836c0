"""``synthetic``: FedProx's Synthetic(alpha, beta), generated from a seed (no files).

``x`` is drawn from the diagonal Gaussian directly (same law as the reference's
``multivariate_normal``) with :func:`numpy.random.default_rng`, so values differ from the
reference script for the same seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fedcomm.data.datasets.options import Options
from fedcomm.data.datasets.registry import register
from fedcomm.data.types import Dataset

_SYNTHETIC_OPTIONS = ("alpha", "beta", "num_users", "dim", "num_classes", "iid", "seed")


@register("synthetic")
def _load_synthetic(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """Synthetic(alpha, beta) of FedProx (Li et al., 2020), one natural client per user.

    Per user k: ``u_k ~ N(0, alpha)``, ``B_k ~ N(0, beta)``, ``W_k ~ N(u_k, 1)`` ``(dim, C)``,
    ``b_k ~ N(u_k, 1)`` ``(C,)``, ``v_k ~ N(B_k, 1)`` ``(dim,)``; ``x ~ N(v_k, Sigma)`` with
    ``Sigma_jj = j^-1.2``; ``y = argmax(x W_k + b_k)``; ``n_k = lognormal(4, 2) + min_samples``.
    ``iid``: one shared ``W, b ~ N(0, 1)`` and ``v_k = B_k`` in every coordinate (reference).
    """
    o = Options("synthetic", options, (*_SYNTHETIC_OPTIONS, "min_samples"))
    alpha, beta = o.number("alpha", 0.0, 0.0), o.number("beta", 0.0, 0.0)
    users, dim = o.integer("num_users", 30, 1), o.integer("dim", 60, 1)
    classes, seed = o.integer("num_classes", 10, 2), o.integer("seed", 0, 0)
    min_samples, iid = o.integer("min_samples", 50, 0), o.flag("iid", False)

    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, users).astype(np.int64) + min_samples  # (users,)
    mean_w = rng.normal(0, alpha, users)  # u_k, also the mean of b_k
    big_b = rng.normal(0, beta, users)  # B_k
    if iid:
        mean_x = np.repeat(big_b[:, None], dim, axis=1)  # (users, dim)
        w_shared, b_shared = rng.normal(0, 1, (dim, classes)), rng.normal(0, 1, classes)
    else:
        mean_x = rng.normal(big_b[:, None], 1, (users, dim))  # (users, dim)
    std = np.arange(1, dim + 1, dtype=np.float64) ** -0.6  # sqrt(Sigma_jj) = (j^-1.2)^0.5
    xs, ys = [], []
    for k in range(users):
        w = w_shared if iid else rng.normal(mean_w[k], 1, (dim, classes))
        b = b_shared if iid else rng.normal(mean_w[k], 1, classes)
        xk = mean_x[k] + rng.standard_normal((int(sizes[k]), dim)) * std  # (n_k, dim)
        xs.append(xk.astype(np.float32))
        ys.append(np.argmax(xk @ w + b, axis=1).astype(np.int64))  # softmax is monotone
    nid = np.repeat(np.arange(users, dtype=np.int64), sizes)
    names = tuple(f"user_{k}" for k in range(users))
    return Dataset(
        "synthetic", np.concatenate(xs), np.concatenate(ys), classes, "classification", nid, names
    )
