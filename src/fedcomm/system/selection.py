"""Who a round samples among the online clients (``train.system.policy.selection``): uniformly
(:func:`fedcomm.system.population.cohort`), or by Oort's utility (:mod:`fedcomm.system.oort`).

Oort's arms start from what the server can know before anyone trains: each client's expected
size (the examples of its local steps a round) and expected duration (the dense model down and
up over its links' mean capacity, its dense local work at its speed, two latencies). A client
that took part is then known by what it reported: ``n_k`` times its mean training loss (Oort's
``|B_k| sqrt(mean ℓ²)`` with the mean loss for the per-example losses' root mean square, which
the loop does not keep) and its measured seconds from its start to its finish. Only clients the
server aggregated report, as in FedScale's implementation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from fedcomm.comm import bits
from fedcomm.seeding import Stream, numpy_rng
from fedcomm.system import oort
from fedcomm.system import population as pop
from fedcomm.system.clock import MBIT, batch_sizes
from fedcomm.system.config import PolicyConfig
from fedcomm.system.flops import TRAIN_OVER_FORWARD, WeightCost

SELECT = 3  # the per-round draws' first key for Oort's sampling (ONLINE 1, COHORT 2)


def start(
    policy: PolicyConfig,
    population: pop.Population,
    cost: WeightCost,
    sizes: Sequence[int],
    local: object,
) -> oort.Arms | None:
    """Oort's arms before round 1 (None under uniform selection). ``sizes``: each client's
    training examples; ``local``: the run's ``LocalConfig`` (batch size, epochs, steps)."""
    if not isinstance(policy.selection, oort.OortConfig):
        return None
    batch, epochs, steps = (getattr(local, k) for k in ("batch_size", "epochs", "steps"))
    per_round = np.array([sum(batch_sizes(n, batch, epochs, steps)) for n in sizes], float)
    dense_bits = float(bits.dense(sum(numel for _, numel in cost.values())))
    example = TRAIN_OVER_FORWARD * sum(flops for flops, _ in cost.values())
    expected = np.array(
        [
            2 * float(population.latency_s[c])
            + dense_bits / (population.down[c].mean_mbps * MBIT)
            + per_round[c] * example / float(population.flops_per_s[c])
            + dense_bits / (population.up[c].mean_mbps * MBIT)
            for c in range(population.size)
        ]
    )
    return oort.Arms.start(policy.selection, per_round, expected)


def choose(
    policy: PolicyConfig,
    arms: oort.Arms | None,
    seed: int,
    round_: int,
    online: Sequence[int],
    k: int,
    draw: int = 0,
) -> list[int]:
    """``k`` of ``online`` for round ``round_`` (its ``draw``-th selection), sorted."""
    if arms is None or not isinstance(policy.selection, oort.OortConfig):
        return pop.cohort(seed, round_, list(online), k, draw)
    rng = numpy_rng(seed, Stream.SYSTEM, SELECT, round_, *((draw,) if draw else ()))
    return oort.select(policy.selection, arms, online, k, round_, rng, first=draw == 0)


def observe(
    arms: oort.Arms | None, reports: Iterable[tuple[int, int, float | None, float]], round_: int
) -> None:
    """Aggregated clients' reports ``(client, examples, mean training loss, seconds)``."""
    if arms is None:
        return
    for client, n, loss, seconds in reports:
        if loss is not None and math.isfinite(loss):
            arms.update(client, n * loss, seconds, round_)
