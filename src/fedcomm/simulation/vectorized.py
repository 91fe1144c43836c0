"""The vectorized executor: a round's local-training jobs as one batched computation.

Jobs that share a :class:`~fedcomm.algorithms._jobs.LocalProgram` and tensor shapes are stacked
along a new leading client axis (``(C, *shape)`` per tensor) in chunks of at most ``chunk_size``
clients. Per step:

1. every client's batch is gathered (``xb (C, B, ...)``, ``yb (C, B, ...)``); a client whose
   batch is shorter than the chunk's longest (a partial last batch) is padded with its first
   example at weight 0, its real examples weighted ``1/n`` (the weighted loss equals the mean);
   a client that has run out of steps does a no-op step;
2. per-step random tensors come from each *active* client's ``draws()`` (its own generator, the
   sequential order), zeros for inactive ones;
3. the gradient phase (data loss, hooks, per-client clipping) runs under
   ``torch.func.vmap(torch.func.grad(...))``;
4. the SGD/Adamax update runs in place on the stacked tensors (elementwise: the same rule);
   ``post_step`` is vmapped; clients that were inactive, or whose loss hit ``skip_loss``, get
   their tensors back;
5. ``after_step`` hooks run per client on views of its slice at the steps they asked for.

Clients are sorted by their number of steps before chunking, so padding is rare. Chunks hold about
``chunk_size x (parameters + gradients + optimizer state + activations)``: the memory bound.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from fedcomm.algorithms._jobs import (
    GradFn,
    JobResult,
    LocalJob,
    apply_update,
    grad_fn,
)
from fedcomm.algorithms._local import LocalConfig
from fedcomm.models.lstm import unrolled

log = logging.getLogger(__name__)

Shapes = tuple[tuple[str, tuple[int, ...], torch.dtype], ...]


def _shapes(tensors: Mapping[str, Tensor]) -> Shapes:
    return tuple((k, tuple(v.shape), v.dtype) for k, v in sorted(tensors.items()))


def group_key(job: LocalJob) -> tuple[Any, ...]:
    """Jobs with equal keys can be stacked: same program object, same tensor layout."""
    x = job.data.x
    return (
        id(job.program),
        _shapes(job.live),
        _shapes(job.frozen),
        _shapes(job.bufs),
        tuple(x.shape[1:]),
        tuple(job.data.y.shape[1:]),
        x.dtype,
    )


def chunks(jobs: Sequence[int], steps: Sequence[int], chunk_size: int) -> list[list[int]]:
    """Indices of ``jobs`` sorted by step count (stable), cut into near-equal chunks of at most
    ``chunk_size``."""
    order = sorted(jobs, key=lambda i: steps[i])
    n = len(order)
    if n == 0:
        return []
    count = -(-n // chunk_size)
    size = -(-n // count)
    return [order[i : i + size] for i in range(0, n, size)]


def train_jobs(
    jobs: Sequence[LocalJob], model: nn.Module, cfg: LocalConfig, chunk_size: int
) -> list[JobResult]:
    """Train every job; results in the order of ``jobs``."""
    results: list[JobResult | None] = [None] * len(jobs)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(group_key(job), []).append(i)
    steps = [len(j.batches) for j in jobs]
    with unrolled(model):  # LSTMs in their gate form: vmap has no rule for the fused kernel
        for members in groups.values():
            for chunk in chunks(members, steps, chunk_size):
                for i, res in zip(
                    chunk, _train_chunk([jobs[i] for i in chunk], model, cfg), strict=True
                ):
                    results[i] = res
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def _stack(dicts: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    return {k: torch.stack([d[k] for d in dicts]) for k in dicts[0]} if dicts else {}


def _train_chunk(chunk: Sequence[LocalJob], model: nn.Module, cfg: LocalConfig) -> list[JobResult]:
    program = chunk[0].program
    C = len(chunk)
    live = _stack([j.live for j in chunk])  # (C, *shape) each
    frozen = _stack([j.frozen for j in chunk])
    bufs = _stack([j.bufs for j in chunk])
    n_steps = [len(j.batches) for j in chunk]
    S = max(n_steps)
    losses = torch.full((S, C), float("nan"))
    touched: set[str] = set()  # frozen keys some after_step hook updated
    phases: dict[bool, Callable[..., Any]] = {}  # the vmapped gradient phase, padded or not
    template: dict[str, Tensor] | None = None
    batches = _Batches(chunk)
    for s in range(S):
        active = [s < n for n in n_steps]
        sizes = [len(j.batches[s]) if a else 0 for j, a in zip(chunk, active, strict=True)]
        B = max(sizes)
        weighted = any(b != B for b in sizes)
        xb, yb, *rest = batches.step(s, sizes, B, weighted)
        wb = rest[0] if rest else None
        step_frozen = frozen
        if chunk[0].draws is not None:
            drawn: list[dict[str, Tensor] | None] = [
                j.draws() if a and j.draws is not None else None
                for j, a in zip(chunk, active, strict=True)
            ]
            template = template or next(d for d in drawn if d is not None)
            t = template
            step_frozen = {
                **frozen,
                **_stack(
                    [
                        d if d is not None else {k: torch.zeros_like(v) for k, v in t.items()}
                        for d in drawn
                    ]
                ),
            }
        if weighted not in phases:  # (building a vmapped function is cheap: no tracing)
            one: GradFn = grad_fn(model, program, cfg, functional=True)
            phases[weighted] = torch.func.vmap(one, in_dims=(0, 0, 0, 0, 0 if weighted else None))
        phase = phases[weighted]
        grads, aux_grads, loss = phase(live, step_frozen, xb, yb, wb)
        losses[s] = loss
        off = [i for i, a in enumerate(active) if not a]
        if program.skip_loss is not None:
            off = sorted(
                # not (v < skip): a NaN loss is skipped too, as on the sequential backend
                set(off) | {i for i, v in enumerate(loss.tolist()) if not v < program.skip_loss}
            )
        saved = _save(live, bufs, off)
        before = {k: v.clone() for k, v in live.items()} if program.post_reads_old else {}
        apply_update(live, bufs, grads, aux_grads, cfg, program.aux)
        if program.post_step is not None:
            post = torch.func.vmap(program.post_step, in_dims=(0, 0, 0))
            live = dict(post(live, step_frozen, before))
        _restore(live, bufs, saved, off)
        hooked = [
            i for i, j in enumerate(chunk) if active[i] and j.after_step and s in j.hook_steps
        ]
        if hooked:
            loss_list = loss.tolist()
            for i in hooked:
                job = chunk[i]
                assert job.after_step is not None
                mine_live = {k: v[i] for k, v in live.items()}
                mine_frozen = {k: v[i] for k, v in frozen.items()}
                updates = job.after_step(s, loss_list[i], mine_live, mine_frozen, job.batches[s])
                if updates is None:
                    continue
                for k, v in updates[0].items():
                    live[k][i].copy_(v)
                for k, v in updates[1].items():
                    frozen[k][i].copy_(v)
                    touched.add(k)
    # per-client copies, so the chunk's stacks are freed with the chunk (memory is bounded by
    # chunk_size, not the cohort); frozen tensors no hook changed are the job's own
    out = []
    for i, (job, n) in enumerate(zip(chunk, n_steps, strict=True)):
        mean = float(losses[:n, i].mean()) if n else float("nan")
        kept = {k: frozen[k][i].clone() if k in touched else v for k, v in job.frozen.items()}
        mine = {k: v[i].clone() for k, v in live.items()}
        out.append(JobResult(mine, kept, {k: v[i].clone() for k, v in bufs.items()}, mean, n))
    return out


class _Batches:
    """Every step's batch of a chunk, gathered from the chunk's concatenated data with one
    ``index_select`` per step (rows of client ``i`` start at ``offset[i]``)."""

    def __init__(self, chunk: Sequence[LocalJob]) -> None:
        self.x = torch.cat([j.data.x for j in chunk])  # (Σ n_i, ...)
        self.y = torch.cat([j.data.y for j in chunk])
        sizes = [j.data.num_examples for j in chunk]
        self.offsets = [sum(sizes[:i]) for i in range(len(chunk))]
        self.chunk = chunk

    def step(self, s: int, sizes: Sequence[int], B: int, weighted: bool) -> tuple[Tensor, ...]:
        """``xb (C, B, ...)``, ``yb (C, B, ...)`` and, when padded, weights ``wb (C, B)``."""
        parts = []
        for j, off, n in zip(self.chunk, self.offsets, sizes, strict=True):
            idx = j.batches[s] + off if n else torch.zeros(0, dtype=torch.long)
            if n < B:  # padding: any valid row, weight 0
                idx = torch.cat([idx, torch.zeros(B - n, dtype=torch.long)])
            parts.append(idx)
        flat = torch.cat(parts)
        C = len(self.chunk)
        xb = self.x.index_select(0, flat).view(C, B, *self.x.shape[1:])
        yb = self.y.index_select(0, flat).view(C, B, *self.y.shape[1:])
        if not weighted:
            return xb, yb
        wb = torch.zeros(C, B)
        for i, n in enumerate(sizes):
            if n:
                wb[i, :n] = 1.0 / n
        return xb, yb, wb


def _save(
    live: Mapping[str, Tensor], bufs: Mapping[str, Tensor], off: Sequence[int]
) -> dict[str, Tensor]:
    if not off:
        return {}
    idx = torch.tensor(off)
    return {
        **{f"live/{k}": v.index_select(0, idx) for k, v in live.items()},
        **{f"bufs/{k}": v.index_select(0, idx) for k, v in bufs.items()},
    }


@torch.no_grad()
def _restore(
    live: dict[str, Tensor],
    bufs: dict[str, Tensor],
    saved: Mapping[str, Tensor],
    off: Sequence[int],
) -> None:
    if not off:
        return
    idx = torch.tensor(off)
    for k, v in live.items():
        v.index_copy_(0, idx, saved[f"live/{k}"])
    for k, v in bufs.items():
        v.index_copy_(0, idx, saved[f"bufs/{k}"])
