"""The round clock: encoded bits and local work -> seconds -> who is aggregated.

A client's part of a round, in simulated seconds from the round's start:

    finish = latency + down_bits / downlink + compute + latency + up_bits / uplink

where the links are per-second capacities (a constant, or a real trace that varies second by
second), ``compute`` is its local work in FLOPs over its speed, and the bits are those its
messages actually encoded (the ledger's). The round ends when the server stops waiting: when the
``K`` clients it aggregates have finished (with over-selection, the first ``K`` of ``K(1 + f)``),
or at the deadline when fewer made it. A client that finishes after that is a straggler: dropped,
or, under ``stragglers: partial``, retrained for the local steps that fit (decided by the loop,
which owns the training).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MBIT = 1e6  # bit/s in one Mbit/s


@dataclass(frozen=True)
class Capacity:
    """One client's link: ``mbps[i]`` Mbit/s during second ``i`` of its trace, cyclically, with
    the client's time 0 at ``start_s`` of it (one bin: a constant link)."""

    mbps: np.ndarray  # float64 [T], T >= 1, some bin > 0
    start_s: float = 0.0

    def __post_init__(self) -> None:
        if self.mbps.ndim != 1 or not len(self.mbps) or not float(self.mbps.max()) > 0:
            raise ValueError("a link needs at least one second of capacity > 0")

    @property
    def mean_mbps(self) -> float:
        return float(self.mbps.mean())

    def _cum(self) -> np.ndarray:  # bits moved from the trace's second 0 to each second [T + 1]
        return np.concatenate([[0.0], np.cumsum(self.mbps * MBIT)])

    def _moved(self, x: float, cum: np.ndarray) -> float:
        """Bits moved from trace position 0 to position ``x`` (seconds, any real >= 0)."""
        t = len(self.mbps)
        k, rest = divmod(x, t)
        i = min(int(rest), t - 1)
        return k * cum[-1] + cum[i] + (rest - i) * self.mbps[i] * MBIT

    def seconds(self, bits: float, at_s: float) -> float:
        """Seconds to move ``bits`` starting at the client's simulated time ``at_s``."""
        if bits <= 0:
            return 0.0
        if len(self.mbps) == 1:
            return bits / (float(self.mbps[0]) * MBIT)
        cum = self._cum()
        p = self.start_s + at_s
        target = self._moved(p, cum) + bits
        k, rem = divmod(target, cum[-1])
        i = int(np.searchsorted(cum, rem, side="left"))  # first second boundary with >= rem
        if cum[i] == rem:  # reached exactly at a boundary (the earliest such)
            x = k * len(self.mbps) + i
        else:  # inside second i - 1, whose capacity is > 0 (cum rises across it)
            i -= 1
            x = k * len(self.mbps) + i + (rem - cum[i]) / (self.mbps[i] * MBIT)
        return max(0.0, x - p)

    def bits_between(self, at_s: float, until_s: float) -> float:
        """Bits this link moves between the client's simulated times ``at_s`` and ``until_s``."""
        if until_s <= at_s:
            return 0.0
        if len(self.mbps) == 1:
            return (until_s - at_s) * float(self.mbps[0]) * MBIT
        cum = self._cum()
        return self._moved(self.start_s + until_s, cum) - self._moved(self.start_s + at_s, cum)


@dataclass(frozen=True)
class ClientTime:
    """One client's round, in seconds from the round's start."""

    client_id: int
    latency_s: float  # per message
    down_s: float
    compute_s: float
    up_s: float

    @property
    def up_start_s(self) -> float:
        return 2 * self.latency_s + self.down_s + self.compute_s

    @property
    def finish_s(self) -> float:
        return self.up_start_s + self.up_s


def client_time(
    client_id: int,
    down: Capacity,
    up: Capacity,
    latency_s: float,
    flops_per_s: float,
    *,
    round_start_s: float,
    down_bits: int,
    work_flops: float,
    up_bits: int,
) -> ClientTime:
    """The client's round: its downlink from ``round_start_s`` (simulated seconds since the run
    began; a trace link is read there), its local work, then its uplink."""
    down_s = down.seconds(down_bits, round_start_s + latency_s)
    compute_s = work_flops / flops_per_s
    up_at = round_start_s + 2 * latency_s + down_s + compute_s
    return ClientTime(client_id, latency_s, down_s, compute_s, up.seconds(up_bits, up_at))


@dataclass(frozen=True)
class Decision:
    """Who the server aggregates and when the round closes."""

    accepted: frozenset[int]
    round_s: float  # seconds from the round's start to its close


def decide(
    times: Sequence[ClientTime],
    k: int,
    deadline_s: float | None,
    leaves_s: Mapping[int, float] | None = None,
) -> Decision:
    """The first ``k`` clients to finish (ties by client id) among those within the deadline
    and, with ``leaves_s``, before they go offline (seconds from the round's start).

    The round closes at the last accepted client's finish when ``k`` made it (or every client
    when fewer were sampled), else at the deadline, where the server stopped waiting; without
    a deadline, when every client has finished or left (a departure drops the connection, so
    the server sees it).
    """

    def limit(t: ClientTime) -> float:
        own = math.inf if leaves_s is None else leaves_s.get(t.client_id, math.inf)
        return min(own, math.inf if deadline_s is None else deadline_s)

    within = [t for t in times if t.finish_s <= limit(t)]
    ranked = sorted(within, key=lambda t: (t.finish_s, t.client_id))[:k]
    wanted = min(k, len(times))
    if len(ranked) == wanted:
        close = max((t.finish_s for t in ranked), default=0.0)
    elif deadline_s is not None:
        close = deadline_s
    else:  # some left before finishing: the server waited for the rest
        close = max(min(t.finish_s, limit(t)) for t in times)
    return Decision(frozenset(t.client_id for t in ranked), close)


def batch_sizes(n: int, batch_size: int, epochs: int | None, steps: int | None) -> list[int]:
    """The sizes of a client's local minibatches (``algorithms.core.sgd.batch_schedule``'s: epochs
    of ``ceil(n / B)`` batches, the last partial; ``steps`` chains epochs and cuts)."""
    if n == 0:
        return []
    per_epoch = [batch_size] * (n // batch_size) + ([n % batch_size] if n % batch_size else [])
    if steps is None:
        return per_epoch * (epochs or 1)
    return (per_epoch * math.ceil(steps / len(per_epoch)))[:steps]


def steps_that_fit(sizes: Sequence[int], seconds_per_example: float, budget_s: float) -> int:
    """How many of the minibatches ``sizes`` fit in ``budget_s`` seconds of compute."""
    if seconds_per_example <= 0:
        return len(sizes)
    spent = np.cumsum(np.asarray(sizes, dtype=np.float64) * seconds_per_example)
    return int(np.searchsorted(spent, budget_s, side="right"))
