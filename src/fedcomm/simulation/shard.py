"""One simulation over many processes: a round's clients sharded over ``torchrun``'s ranks.

Every rank runs the same loop on the same state: the same cohort, server state and draws (all of
them come from ``(seed, stream, ...)``, never from a process). Only step 3, the clients' local
work, is split: rank ``r`` trains its share of the cohort (:func:`assign`) on the backend it
would use alone, then every rank's :class:`~fedcomm.simulation.backends.Turn` s are gathered to
every rank (:func:`gather`), in cohort order, and the round goes on as in one process: encoding
with each client's generator where its training left it, the ledger, the aggregate, the server
step. A client trains the same wherever it runs, so metrics, ledgers and the final model equal a
one-process run's: bit for bit on the sequential backend (at the same intra-op threads); on the
vectorized one the chunks hold other clients, so batched sums may differ in the last bits (the
contract tests' tolerance).

Rank 0 alone evaluates, writes checkpoints, outputs and MLflow; the others skip evaluation and
start the next round's training while it does. A rank that dies stops ``torchrun``'s whole job
(the other ranks are waiting for its clients); the checkpoint rank 0 wrote last resumes the run,
with any number of processes: the state does not depend on it.

The gathers travel over gloo, on GPUs too (what is exchanged goes through host memory, so ranks
may also share one GPU): each rank's turns are serialized once with :func:`torch.save` and loaded
onto the rank's device.
:class:`Shard` counts the bytes gathered and the seconds spent waiting (benchmarks/sharding.py).
"""

from __future__ import annotations

import io
import os
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from fedcomm.errors import InputError

WORLD_ENV = "WORLD_SIZE"  # set by torchrun


@dataclass
class Traffic:
    """What the gathers cost this process: bytes it received and sent, seconds in gathers
    (waiting for the slowest rank included), gathers (two a round)."""

    bytes_in: int = 0
    bytes_out: int = 0
    seconds: float = 0.0
    gathers: int = 0


@dataclass(frozen=True)
class Shard:
    """This process's place in the job: ``rank`` of ``world``; ``group`` carries the gathers."""

    rank: int
    world: int
    local_rank: int = 0
    group: Any = None  # the process group of the gathers (None: the default one, gloo)
    traffic: Traffic = field(default_factory=Traffic)

    @property
    def writes(self) -> bool:
        """Whether this process evaluates and writes (checkpoints, outputs, MLflow)."""
        return self.rank == 0

    def device(self, dev: torch.device) -> torch.device:
        """The rank's own accelerator: ``cuda:<local rank>`` for a run on CUDA, where there are
        that many GPUs (else all ranks share ``dev``)."""
        if dev.type == "cuda" and torch.cuda.device_count() > 1:
            return torch.device("cuda", self.local_rank % torch.cuda.device_count())
        return dev


def torchrun(nproc: int, args: Sequence[str]) -> int:
    """``python -m fedcomm.cli *args`` as ``nproc`` processes on this machine, started as
    ``torchrun --standalone --nproc-per-node nproc`` does (torch's elastic launcher, no restarts:
    a process that fails stops the others), importing the fedcomm this process runs, each with
    ``OMP_NUM_THREADS`` = cores / nproc unless it is set. Returns 0, or the first failed
    process's exit status (128 + the signal that killed it), after one line on stderr."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    import fedcomm

    src = str(Path(fedcomm.__file__).resolve().parent.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.5,
    )  # fmt: skip
    try:
        elastic_launch(config, sys.executable)("-m", "fedcomm.cli", *args)
    except ChildFailedError as err:
        rank, first = err.get_first_failure()
        code = first.exitcode or 1
        how = f"exit status {code}" if code > 0 else f"killed by signal {-code}"
        print(
            f"error: process {rank} of {nproc} stopped ({how}), and with it the run; the same "
            "command resumes from its last checkpoint, with any number of processes",
            file=sys.stderr,
        )
        return code if code > 0 else 128 - code
    return 0


def world_size() -> int:
    """The number of processes of the job this process is part of (1: none)."""
    try:
        return int(os.environ.get(WORLD_ENV, "1"))
    except ValueError:
        raise InputError(f"{WORLD_ENV}: {os.environ[WORLD_ENV]!r} is not an integer") from None


def start(dev: torch.device) -> Shard | None:
    """This process's :class:`Shard` when it runs under ``torchrun`` with more than one process
    (the gloo process group started; on CUDA the rank's GPU made current), else None."""
    world = world_size()
    if world <= 1:
        return None
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if dev.type == "cuda":
        torch.cuda.set_device(Shard(rank, world, local).device(dev))
    if not dist.is_initialized():
        dist.init_process_group("gloo")  # (every exchange is host bytes: no NCCL needed)
    return Shard(rank, world, local)


def finish(shard: Shard | None) -> None:
    """Leave the job's process group (after every rank's last gather)."""
    if shard is not None and dist.is_initialized():
        dist.destroy_process_group()


def barrier(shard: Shard | None) -> None:
    if shard is not None:
        dist.barrier(group=shard.group)


def assign(sizes: Sequence[int], world: int) -> list[list[int]]:
    """Indices ``0 … len(sizes)-1`` (cohort positions) split over ``world`` ranks, balanced by
    ``sizes`` (each client's examples, the work it brings): largest first to the least loaded
    rank (ties: the lower rank, then the earlier position); each rank's indices in cohort order.
    A function of the sizes alone, so every rank computes the same split."""
    load = [0] * world
    shares: list[list[int]] = [[] for _ in range(world)]
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        shares[r].append(i)
        load[r] += max(1, sizes[i])
    return [sorted(s) for s in shares]


def gather(
    shard: Shard, mine: Sequence[Any], dev: torch.device, *, to_all: bool = True
) -> list[list[Any]] | None:
    """Every rank's ``mine`` (picklable objects with tensors), by rank, on ``dev``: on every rank
    (``to_all``), else on rank 0 only (None elsewhere). One serialization per rank
    (:func:`torch.save`), sent as a byte tensor over the gloo group."""
    t0 = time.perf_counter()
    buf = io.BytesIO()
    torch.save(list(mine), buf)
    blob = torch.frombuffer(bytearray(buf.getbuffer()), dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.long) for _ in range(shard.world)]
    dist.all_gather(sizes, torch.tensor([blob.numel()]), group=shard.group)
    longest = max(int(n) for n in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: blob.numel()] = blob
    receives = to_all or shard.writes
    blobs = [torch.empty(longest, dtype=torch.uint8) for _ in range(shard.world)]
    if to_all:
        dist.all_gather(blobs, padded, group=shard.group)
    else:
        dst = dist.get_global_rank(shard.group, 0) if shard.group is not None else 0
        dist.gather(padded, blobs if receives else None, dst=dst, group=shard.group)
    out: list[list[Any]] | None = [] if receives else None
    for r, (b, n) in enumerate(zip(blobs, sizes, strict=True)):
        if out is None:
            break
        if r == shard.rank:
            out.append(list(mine))
            continue
        out.append(torch.load(io.BytesIO(b[: int(n)].numpy().tobytes()), map_location=dev,
                              weights_only=False))  # fmt: skip
        shard.traffic.bytes_in += int(n)
    shard.traffic.bytes_out += blob.numel() * (shard.world - 1 if to_all else int(not shard.writes))
    shard.traffic.seconds += time.perf_counter() - t0
    shard.traffic.gathers += 1
    return out


def in_order(shares: Sequence[Sequence[int]], by_rank: Sequence[Sequence[Any]]) -> Iterator[Any]:
    """The gathered items back in cohort order (``shares[r][j]`` is the position of
    ``by_rank[r][j]``)."""
    placed: dict[int, Any] = {}
    for share, items in zip(shares, by_rank, strict=True):
        if len(share) != len(items):
            raise RuntimeError(f"a rank returned {len(items)} clients for a share of {len(share)}")
        placed.update(zip(share, items, strict=True))
    return (placed[i] for i in range(len(placed)))
