"""Who the clients are: one draw per client of its links, latency, speed and availability.

Every draw comes from the run's seed (stream ``SYSTEM``): the population from keys
``(0, quantity)``, drawn once, before round 1, so a resumed run redraws the same clients; who is
online in round ``r`` from ``(1, r)``; the cohort among them from ``(2, r)`` (an asynchronous
server's ``d``-th later start in round ``r``: ``(1, r, d)`` and ``(2, r, d)``). The same seed gives
the same clock on both backends (the draws never touch torch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcomm.errors import InputError
from fedcomm.seeding import Stream, numpy_rng
from fedcomm.system import diurnal, tables, traces
from fedcomm.system.clock import Capacity
from fedcomm.system.config import (
    AiBenchmark,
    AvailabilityTable,
    Constant,
    FlashLink,
    FromTable,
    Latency,
    LogNormal,
    SystemConfig,
    TraceLink,
    Uniform,
    Windows,
)
from fedcomm.system.diurnal import Diurnal

# the population's quantities: their keys in the seed (never renumber)
DOWN, UP, LATENCY, SPEED, ROWS, TRACE_DOWN, TRACE_UP, DIURNAL = 1, 2, 3, 4, 5, 6, 7, 8
ONLINE, COHORT = 1, 2  # the per-round draws' first key


@dataclass(frozen=True)
class Population:
    """The clients of one run, index = client id."""

    down: list[Capacity]
    up: list[Capacity]
    latency_s: np.ndarray  # float64 [clients], per message
    flops_per_s: np.ndarray  # float64 [clients]
    p_online: np.ndarray | None  # float64 [clients], or None with windows or diurnal
    windows: tables.Windows | None
    diurnal: diurnal.DiurnalClients | None = None

    @property
    def size(self) -> int:
        return len(self.down)

    def online(self, seed: int, round_: int, at_s: float, draw: int = 0) -> list[int]:
        """The clients online at simulated time ``at_s``: the start of round ``round_``, or its
        ``draw``-th later draw (an asynchronous server's starts during the round)."""
        if self.windows is not None or self.diurnal is not None:
            days = self.windows if self.windows is not None else self.diurnal
            assert days is not None
            mask = days.online_mask(np.arange(self.size), at_s)
            return [int(c) for c in np.flatnonzero(mask)]
        assert self.p_online is not None
        u = numpy_rng(seed, Stream.SYSTEM, ONLINE, round_, *_later(draw)).random(self.size)
        return [int(c) for c in np.flatnonzero(u < self.p_online)]

    def offline_at(self, client: int, at_s: float) -> float:
        """When ``client``, online at simulated time ``at_s``, goes offline (``inf``: not before
        the round is redrawn: a per-round probability has nobody leave mid-round)."""
        if self.windows is not None:
            return self.windows.offline_at(client, at_s)
        if self.diurnal is not None:
            return self.diurnal.offline_at(client, at_s)
        return math.inf


def cohort(seed: int, round_: int, online: list[int], k: int, draw: int = 0) -> list[int]:
    """``k`` distinct clients drawn from ``online`` (all of them when fewer), sorted; ``draw``
    as :meth:`Population.online`'s."""
    if len(online) <= k:
        return sorted(online)
    rng = numpy_rng(seed, Stream.SYSTEM, COHORT, round_, *_later(draw))
    return sorted(int(online[i]) for i in rng.choice(len(online), size=k, replace=False))


def _later(draw: int) -> tuple[int, ...]:
    """The extra key of a round's ``draw``-th later draw (none for its first: the round's)."""
    return (draw,) if draw else ()


def draw(cfg: SystemConfig, num_clients: int, seed: int, root: Path | None) -> Population:
    """The run's clients (``root``: the data root, for the real traces; the table's path is
    read relative to the working directory, the build's)."""
    table = _table(cfg, num_clients, seed)

    def scalar(dist: object, key: int, column: str) -> np.ndarray:
        rng = numpy_rng(seed, Stream.SYSTEM, 0, key)
        if isinstance(dist, Constant | Latency):
            return np.full(num_clients, float(dist.value))
        if isinstance(dist, LogNormal):
            return dist.median * np.exp(dist.sigma * rng.standard_normal(num_clients))
        if isinstance(dist, Uniform):
            return rng.uniform(dist.low, dist.high, num_clients)
        if isinstance(dist, FromTable):
            assert table is not None
            return np.asarray(getattr(table, column), dtype=np.float64)
        raise AssertionError(dist)

    def link(direction: str, key: int, trace_key: int) -> list[Capacity]:
        dist = cfg.links.down if direction == "down" else cfg.links.up
        if isinstance(dist, TraceLink):
            return _trace_links(dist, direction, num_clients, seed, trace_key, root)
        if isinstance(dist, FlashLink):
            users = traces.flash_users(_need(root, "flash"))  # [users, 4] Mbit/s
            rng = numpy_rng(seed, Stream.SYSTEM, 0, key)
            pick = rng.integers(0, len(users), num_clients)
            mean, std = (users[pick, 0], users[pick, 1]) if direction == "down" else (
                users[pick, 2], users[pick, 3])  # fmt: skip
            mbps = np.maximum(mean + std * rng.standard_normal(num_clients), 0.01 * mean)
        else:
            mbps = scalar(dist, key, f"{direction}_mbps")
        return [Capacity(np.array([float(v)])) for v in mbps]

    speed_dist = cfg.compute.speed
    if isinstance(speed_dist, AiBenchmark):
        scores = traces.compute_scores(_need(root, "ai_benchmark"))
        pick = numpy_rng(seed, Stream.SYSTEM, 0, SPEED).integers(0, len(scores), num_clients)
        speed = scores[pick] / float(np.median(scores))
    else:
        speed = scalar(speed_dist, SPEED, "compute_speed")
    avail = cfg.availability
    p_online: np.ndarray | None = None
    windows: tables.Windows | None = None
    days: diurnal.DiurnalClients | None = None
    if isinstance(avail, Windows):
        windows = tables.read_windows(avail.path)
    elif isinstance(avail, Diurnal):
        days = diurnal.draw(avail, num_clients, numpy_rng(seed, Stream.SYSTEM, 0, DIURNAL))
    elif isinstance(avail, AvailabilityTable):
        if table is None or table.availability is None:
            raise InputError(f"system.table {cfg.table}: no availability column")
        p_online = np.asarray(table.availability, dtype=np.float64)
    else:
        p_online = np.full(num_clients, float(avail.p))
    if cfg.links.latency_s.kind == "table" and (table is None or table.latency_s is None):
        raise InputError(f"system.table {cfg.table}: no latency_s column")
    return Population(
        down=link("down", DOWN, TRACE_DOWN),
        up=link("up", UP, TRACE_UP),
        latency_s=scalar(cfg.links.latency_s, LATENCY, "latency_s"),
        flops_per_s=speed * cfg.compute.reference_flops,
        p_online=p_online,
        windows=windows,
        diurnal=days,
    )


def _need(root: Path | None, kind: str) -> Path:
    if root is None:
        raise InputError(
            f"system: kind {kind!r} reads the traces under the data root, and none is set "
            "(data.root or FEDCOMM_DATA_ROOT)"
        )
    return root


def _trace_links(
    dist: TraceLink, direction: str, n: int, seed: int, key: int, root: Path | None
) -> list[Capacity]:
    found = traces.link_traces(_need(root, "trace"), dist.source, direction)  # type: ignore[arg-type]
    rng = numpy_rng(seed, Stream.SYSTEM, 0, key)
    pick = rng.integers(0, len(found), n)
    out = []
    for i in pick:
        mbps = found[int(i)].mbps
        start = int(rng.integers(0, len(mbps)))
        if dist.window_s is not None:  # its own window, cyclic inside it
            rolled = np.roll(mbps, -start)
            if not float(rolled[: dist.window_s].max()) > 0:  # all outage: start at the signal
                rolled = np.roll(rolled, -int(np.argmax(rolled > 0)))
            out.append(Capacity(rolled[: dist.window_s].astype(np.float64), 0.0))
        else:
            out.append(Capacity(mbps.astype(np.float64), float(start)))
    return out


def _table(cfg: SystemConfig, n: int, seed: int) -> tables.ClientTable | None:
    """The user's table, one row per client (by id, or drawn)."""
    if cfg.table is None:
        return None
    table = tables.read_client_table(cfg.table)
    if cfg.assign == "draw":
        rows = numpy_rng(seed, Stream.SYSTEM, 0, ROWS).integers(0, len(table.client_id), n)
    else:
        index = {int(c): i for i, c in enumerate(table.client_id)}
        missing = [c for c in range(n) if c not in index]
        if missing:
            raise InputError(
                f"system.table {cfg.table}: no row for client(s) {missing[:10]}"
                f"{' ...' if len(missing) > 10 else ''} of the run's {n} (ids 0..{n - 1}); "
                "add them, or set system.assign: draw"
            )
        rows = np.array([index[c] for c in range(n)])

    def pick(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else np.asarray(a)[rows]

    return tables.ClientTable(
        client_id=np.arange(n, dtype=np.int64),
        down_mbps=np.asarray(table.down_mbps)[rows],
        up_mbps=np.asarray(table.up_mbps)[rows],
        compute_speed=np.asarray(table.compute_speed)[rows],
        availability=pick(table.availability),
        latency_s=pick(table.latency_s),
    )
