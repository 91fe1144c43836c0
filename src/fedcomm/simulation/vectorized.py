"""The vectorized executor: a round's local-training jobs as one batched computation.

Jobs that share a :class:`~fedcomm.algorithms.core.jobs.LocalProgram` and tensor shapes are stacked
along a new leading client axis (``(C, *shape)`` per tensor) in chunks of at most ``chunk_size``
clients. Per step:

1. every client's batch is gathered (``xb (C, B, ...)``, ``yb (C, B, ...)``); a client whose
   batch is shorter than the chunk's longest (a partial last batch) is padded with its first
   example at weight 0, its real examples weighted ``1/n`` (the weighted loss equals the mean);
   a client that has run out of steps does a no-op step;
2. per-step random tensors come from each *active* client's ``draws()`` (its own generator, the
   sequential order), zeros for inactive ones; so do dropout masks, from each active client's
   dropout stream for its own batch's rows (:mod:`fedcomm.models.dropout`), keeping all on
   padding rows and inactive clients;
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
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from fedcomm.algorithms.core.jobs import (
    GradFn,
    JobResult,
    LocalJob,
    LocalProgram,
    apply_update,
    grad_fn,
)
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.models import dropout
from fedcomm.models.lstm import unrolled
from fedcomm.simulation import device as dev_mod

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


AUTO_MEMORY_FRACTION = 0.5  # chunk_size auto: the share of the free memory a chunk may fill

# train.compile: torch.compile of the batched gradient phase (none: eager vmap)
COMPILE_MODES = ("none", "inductor", "reduce-overhead", "max-autotune", "cudagraphs", "aot_eager")


class Compiler:
    """``train.compile``: the vmapped gradient phase through :func:`torch.compile`, built once
    per (program, padded or not) for the whole run (its graphs kept between chunks and rounds).

    ``inductor``: generated kernels (torch.compile's default); ``reduce-overhead``: the same,
    replayed as CUDA graphs (one launch a step instead of one a kernel: for launch-bound rounds,
    W1's on a GPU); ``max-autotune``: with kernel autotuning; ``cudagraphs``: CUDA graphs of
    the eager kernels; ``aot_eager``: traced, eager kernels (checks the capture; no speed-up).
    Shapes are static: a new chunk size or batch size traces once more."""

    def __init__(self, how: str = "none") -> None:
        if how not in COMPILE_MODES:
            raise ValueError(f"train.compile: {how!r} is not one of {list(COMPILE_MODES)}")
        self.how = how
        self.cache: dict[tuple[Any, ...], Callable[..., Any]] = {}

    def __call__(self, key: tuple[Any, ...], build: Callable[[], Any]) -> Callable[..., Any]:
        if self.how == "none":
            return build()
        if key not in self.cache:
            if self.how in ("reduce-overhead", "max-autotune"):
                self.cache[key] = torch.compile(build(), mode=self.how, dynamic=False)
            elif self.how == "inductor":
                self.cache[key] = torch.compile(build(), dynamic=False)
            else:
                self.cache[key] = torch.compile(build(), backend=self.how, dynamic=False)
        return self.cache[key]


def train_jobs(
    jobs: Sequence[LocalJob],
    model: nn.Module,
    cfg: LocalConfig,
    chunk_size: int | str,
    sizes: dict[tuple[Any, ...], int] | None = None,
    compiler: Compiler | None = None,
) -> list[JobResult]:
    """Train every job; results in the order of ``jobs``. ``chunk_size="auto"`` sizes each
    group's chunks with :func:`auto_chunk_size` once and remembers it in ``sizes`` (the
    caller keeps it for the run, so a run's chunks do not change from round to round);
    ``compiler`` (kept by the caller for the run) compiles the gradient phase."""
    results: list[JobResult | None] = [None] * len(jobs)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, job in enumerate(jobs):
        groups.setdefault(group_key(job), []).append(i)
    steps = [len(j.batches) for j in jobs]
    sizes = {} if sizes is None else sizes
    with unrolled(model):  # LSTMs in their gate form: vmap has no rule for the fused kernel
        for key, members in groups.items():
            size = chunk_size
            if not isinstance(size, int):
                shape_key = key[1:]  # (the program object may change between rounds)
                if shape_key not in sizes:
                    sizes[shape_key] = auto_chunk_size(jobs[members[0]], model, cfg)
                    log.info("chunk_size auto: %d clients per chunk", sizes[shape_key])
                size = sizes[shape_key]
            for chunk in chunks(members, steps, size):
                trained = _train_chunk([jobs[i] for i in chunk], model, cfg, compiler or Compiler())
                for i, res in zip(chunk, trained, strict=True):
                    results[i] = res
    assert all(r is not None for r in results)
    return [r for r in results if r is not None]


def auto_chunk_size(
    job: LocalJob, model: nn.Module, cfg: LocalConfig, free: int | None = None
) -> int:
    """Clients per chunk that fit in :data:`AUTO_MEMORY_FRACTION` of the device's free memory
    (``free`` bytes; measured when None).

    A client costs its stacked tensors (trained, frozen, optimizer state, each with a gradient
    or update temporary: 2x) plus one step's working memory, measured as the bytes of every
    tensor a one-client batched gradient step on a full batch creates (an upper bound on its
    peak, as temporaries are freed during the step)."""
    dev = next(iter(job.live.values())).device
    free = dev_mod.free_bytes(dev) if free is None else free
    state = sum(
        v.numel() * v.element_size()
        for part in (job.live, job.frozen, job.bufs)
        for v in part.values()
    )
    per_client = 2 * state + step_bytes(job, model, cfg)
    return max(1, int(AUTO_MEMORY_FRACTION * free) // max(1, per_client))


class _Allocated(TorchDispatchMode):
    """Counts the bytes of every tensor the operations under it return."""

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, Tensor):
                self.total += t.numel() * t.element_size()
        return out


def step_bytes(job: LocalJob, model: nn.Module, cfg: LocalConfig) -> int:
    """Bytes created by one vmapped gradient step of ``job``'s model on a full batch (the
    model's plain objective: hooks and gates add tensors of the parameters' size, which the
    2x state term of :func:`auto_chunk_size` covers)."""
    names = {n for n, _ in model.named_parameters()}
    params = {k: v[None] for k, v in {**job.frozen, **job.live}.items() if k in names}
    params.update({n: p.detach()[None] for n, p in model.named_parameters() if n not in params})
    rows = torch.arange(min(cfg.batch_size, job.data.num_examples), device=job.data.x.device)
    x, y = job.data.x[rows][None], job.data.y[rows][None]
    masks = dropout.kept_all(dropout.sites(model, job.data.x[:1]), len(rows))
    masks = {k: v[None].to(x.device) for k, v in masks.items()}  # (1, B, *shape)
    phase = torch.func.vmap(
        grad_fn(model, LocalProgram(), cfg, functional=True), in_dims=(0, 0, 0, 0, None)
    )
    with _Allocated() as counter:
        phase(params, masks, x, y, None)
    return counter.total


def _stack(dicts: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    return {k: torch.stack([d[k] for d in dicts]) for k in dicts[0]} if dicts else {}


def _train_chunk(
    chunk: Sequence[LocalJob], model: nn.Module, cfg: LocalConfig, compiler: Compiler
) -> list[JobResult]:
    program = chunk[0].program
    C = len(chunk)
    live = _stack([j.live for j in chunk])  # (C, *shape) each
    frozen = _stack([j.frozen for j in chunk])
    bufs = _stack([j.bufs for j in chunk])
    n_steps = [len(j.batches) for j in chunk]
    S = max(n_steps)
    dev = next(iter(live.values())).device
    losses = torch.full((S, C), float("nan"), device=dev)  # stays on the device until the end
    touched: set[str] = set()  # frozen keys some after_step hook updated
    phases: dict[bool, Callable[..., Any]] = {}  # the vmapped gradient phase, padded or not
    template: dict[str, Tensor] | None = None
    batches = _Batches(chunk, S)
    plan = dropout.sites(model, chunk[0].data.x[:1]) if chunk[0].dropout is not None else ()
    for s in range(S):
        active = [s < n for n in n_steps]
        xb, yb, wb = batches.step(s)
        weighted = wb is not None
        step_frozen = frozen
        if chunk[0].draws is not None:
            drawn, template = _draws(chunk, active, template, dev)
            step_frozen = {**frozen, **drawn}
        masks = _dropout_masks(chunk, active, s, xb.shape[1], plan, dev)
        if weighted not in phases:  # (building a vmapped function is cheap: no tracing)
            one: GradFn = grad_fn(model, program, cfg, functional=True)
            dims = (0, 0, 0, 0, 0 if weighted else None)
            phases[weighted] = compiler(  # (the step reads cfg: clipping)
                (program, weighted, cfg.model_dump_json()),
                partial(torch.func.vmap, one, in_dims=dims),
            )
        phase = phases[weighted]
        grads, aux_grads, loss = phase(
            live, {**step_frozen, **masks} if masks else step_frozen, xb, yb, wb
        )
        losses[s] = loss
        off = [i for i, a in enumerate(active) if not a]  # known on the host: no sync
        saved = _save(live, bufs, off)
        # a step whose loss reaches skip_loss is undone on the device (not (v < skip): a NaN
        # loss is skipped too, as on the sequential backend); no loss is read on the host
        undo = ~(loss < program.skip_loss) if program.skip_loss is not None else None
        undo_to = (
            ({k: v.clone() for k, v in live.items()}, {k: v.clone() for k, v in bufs.items()})
            if undo is not None
            else None
        )
        before = {k: v.clone() for k, v in live.items()} if program.post_reads_old else {}
        apply_update(live, bufs, grads, aux_grads, cfg, program.aux)
        if program.post_step is not None:
            post = torch.func.vmap(program.post_step, in_dims=(0, 0, 0))
            live = dict(post(live, step_frozen, before))
        if undo is not None and undo_to is not None:
            _undo(live, undo_to[0], undo)
            _undo(bufs, undo_to[1], undo)
        _restore(live, bufs, saved, off)
        touched |= _after_step(chunk, active, s, loss, live, frozen)
    # each client's results are views of the chunk's stacks (no copy: the results of every
    # client live until the server update anyway, and together they are the stacks' size);
    # frozen tensors no hook changed are the job's own, so the frozen stacks are freed here
    out = []
    mean_losses = _mean_losses(losses, n_steps)  # one copy to the host per chunk
    mine = _unstack(live, C)
    own_bufs = _unstack(bufs, C)
    for i, (job, n) in enumerate(zip(chunk, n_steps, strict=True)):
        kept = {k: frozen[k][i].clone() if k in touched else v for k, v in job.frozen.items()}
        out.append(JobResult(mine[i], kept, own_bufs[i], mean_losses[i], n))
    return out


def _draws(
    chunk: Sequence[LocalJob],
    active: Sequence[bool],
    template: dict[str, Tensor] | None,
    dev: torch.device,
) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """A step's random draws of the chunk's active clients, stacked on ``dev`` (an inactive
    client's are zeros shaped like ``template``, the first draws seen); and the template."""
    drawn: list[dict[str, Tensor] | None] = [
        j.draws() if a and j.draws is not None else None for j, a in zip(chunk, active, strict=True)
    ]
    template = template or next(d for d in drawn if d is not None)
    t = template
    stacked = _stack(  # drawn on the clients' CPU generators, moved in one copy each
        [d if d is not None else {k: torch.zeros_like(v) for k, v in t.items()} for d in drawn]
    )
    return {k: v.to(dev, non_blocking=True) for k, v in stacked.items()}, template


def _dropout_masks(
    chunk: Sequence[LocalJob],
    active: Sequence[bool],
    s: int,
    B: int,
    plan: tuple[dropout.Site, ...],
    dev: torch.device,
) -> dict[str, Tensor]:
    """Step ``s``'s dropout masks ``(C, B, *shape)`` on ``dev``: each active client's drawn from
    its own stream for its batch's rows (as the sequential executor draws them), padding rows
    and inactive clients keeping all."""
    if not plan:
        return {}
    per_client = []
    for job, on in zip(chunk, active, strict=True):
        if not on or job.dropout is None:
            per_client.append(dropout.kept_all(plan, B))
            continue
        rows = len(job.batches[s])
        drawn = dropout.draw(plan, rows, job.dropout)
        if rows < B:
            pad = dropout.kept_all(plan, B - rows)
            drawn = {k: torch.cat([v, pad[k]]) for k, v in drawn.items()}
        per_client.append(drawn)
    return {k: v.to(dev, non_blocking=True) for k, v in _stack(per_client).items()}


def _after_step(
    chunk: Sequence[LocalJob],
    active: Sequence[bool],
    s: int,
    loss: Tensor,
    live: dict[str, Tensor],
    frozen: dict[str, Tensor],
) -> set[str]:
    """Step ``s``'s ``after_step`` hooks of the active clients that have one, their updates
    copied into the stacks; the frozen keys they updated."""
    touched: set[str] = set()
    hooked = [i for i, j in enumerate(chunk) if active[i] and j.after_step and s in j.hook_steps]
    if not hooked:
        return touched
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
    return touched


def _unstack(stacked: Mapping[str, Tensor], C: int) -> list[dict[str, Tensor]]:
    """``C`` per-client dicts of views of ``stacked`` ``(C, *shape)`` tensors."""
    per_key = {k: v.unbind(0) for k, v in stacked.items()}
    return [{k: views[i] for k, views in per_key.items()} for i in range(C)]


def _mean_losses(losses: Tensor, n_steps: Sequence[int]) -> list[float]:
    """Each client's mean loss over its own steps (``losses (S, C)``; NaN without steps)."""
    S = losses.shape[0]
    taken = torch.arange(S, device=losses.device)[:, None] < torch.tensor(
        n_steps, device=losses.device
    )  # (S, C)
    total = torch.where(taken, losses, torch.zeros_like(losses)).sum(0)
    means = (total / taken.sum(0)).tolist()  # 0/0: NaN for a client without steps
    return [float(m) for m in means]


class _Batches:
    """Every step's batch of a chunk, gathered from the chunk's concatenated data with one
    ``index_select`` per step (rows of client ``i`` start at ``offset[i]``). Every step's row
    indices and padding weights are built on the host once, and copied to the device in one
    transfer, so a step does no per-client work."""

    def __init__(self, chunk: Sequence[LocalJob], S: int) -> None:
        self.x = torch.cat([j.data.x for j in chunk])  # (Σ n_i, ...)
        self.y = torch.cat([j.data.y for j in chunk])
        dev = self.x.device
        sizes = [j.data.num_examples for j in chunk]
        offsets = [sum(sizes[:i]) for i in range(len(chunk))]
        self.C = len(chunk)
        self.weights: Tensor | None = None
        self.layout: list[tuple[int, int, int | None]] = []  # (start, B, weight row or None)
        counts = [len(b) for b in chunk[0].batches]
        if counts and all([len(b) for b in j.batches] == counts for j in chunk):  # no padding
            # every client's s-th batch has the same size: one cat per client, one per step
            rows = [torch.cat(j.batches) + off for j, off in zip(chunk, offsets, strict=True)]
            per_step = torch.stack(rows).split(counts, dim=1)  # S blocks of (C, B_s)
            self.flat = torch.cat([block.reshape(-1) for block in per_step]).to(dev)
            start = 0
            for B in counts:
                self.layout.append((start, B, None))
                start += self.C * B
            return
        flats: list[Tensor] = []
        weights: list[Tensor] = []
        start = 0
        for s in range(S):
            counts = [len(j.batches[s]) if s < len(j.batches) else 0 for j in chunk]
            B = max(counts)
            parts = []
            for j, off, n in zip(chunk, offsets, counts, strict=True):
                idx = j.batches[s] + off if n else torch.zeros(0, dtype=torch.long, device="cpu")
                if n < B:  # padding: any valid row, weight 0
                    idx = torch.cat([idx, torch.zeros(B - n, dtype=torch.long, device="cpu")])
                parts.append(idx)
            flats.append(torch.cat(parts))
            row: int | None = None
            if any(n != B for n in counts):  # weighted: real rows 1/n, padding 0
                wb = torch.zeros(self.C, B, device="cpu")
                for i, n in enumerate(counts):
                    if n:
                        wb[i, :n] = 1.0 / n
                row = sum(w.numel() for w in weights)
                weights.append(wb.flatten())
            self.layout.append((start, B, row))
            start += self.C * B
        self.flat = torch.cat(flats).to(dev)  # every step's rows, one copy
        self.weights = torch.cat(weights).to(dev) if weights else None

    def step(self, s: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """``xb (C, B, ...)``, ``yb (C, B, ...)`` and, when padded, weights ``wb (C, B)``."""
        start, B, row = self.layout[s]
        C = self.C
        flat = self.flat[start : start + C * B]
        xb = self.x.index_select(0, flat).view(C, B, *self.x.shape[1:])
        yb = self.y.index_select(0, flat).view(C, B, *self.y.shape[1:])
        if row is None:
            return xb, yb, None
        assert self.weights is not None
        return xb, yb, self.weights[row : row + C * B].view(C, B)


@torch.no_grad()
def _undo(tensors: dict[str, Tensor], kept: Mapping[str, Tensor], undo: Tensor) -> None:
    """Put back the stacked tensors of the clients flagged in ``undo (C,)``, on the device."""
    for k, v in tensors.items():
        v.copy_(torch.where(undo.view(-1, *([1] * (v.dim() - 1))), kept[k], v))


def _save(
    live: Mapping[str, Tensor], bufs: Mapping[str, Tensor], off: Sequence[int]
) -> dict[str, Tensor]:
    if not off:
        return {}
    idx = torch.tensor(off, device=next(iter(live.values())).device)
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
    idx = torch.tensor(off, device=next(iter(live.values())).device)
    for k, v in live.items():
        v.index_copy_(0, idx, saved[f"live/{k}"])
    for k, v in bufs.items():
        v.index_copy_(0, idx, saved[f"bufs/{k}"])
