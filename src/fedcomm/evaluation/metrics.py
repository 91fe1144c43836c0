"""Model evaluation: mean cross-entropy, top-1 and top-k accuracy of given parameters.

The model is a template: :func:`evaluate` runs it with the parameters it is handed through
``torch.func.functional_call``, so the same module serves the global model and every client's
last upload without copying it.

Classification logits are ``(B, C)`` with targets ``(B,)``; sequence logits ``(B, T, V)`` with
targets ``(B, T)`` are flattened to tokens, so ``n`` then counts tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypedDict, Unpack

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from fedcomm.models.progressive import structure_for


@dataclass(frozen=True)
class EvalResult:
    """Metrics of one model on one set of examples.

    Attributes:
        n: number of examples (tokens for sequence targets) evaluated.
        loss: mean cross-entropy (nats); NaN when ``n == 0``.
        accuracy: top-1 accuracy in [0, 1]; NaN when ``n == 0``.
        topk: ``{k: top-k accuracy in [0, 1]}`` for each requested ``k``.
    """

    n: int
    loss: float
    accuracy: float
    topk: Mapping[int, float] = field(default_factory=dict)


def flatten_logits(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Flatten ``(..., C)`` logits and ``(...)`` targets to ``(N, C)`` and ``(N,)``.

    Args:
        logits: ``(B, C)`` or ``(B, T, V)`` scores.
        y: ``(B,)`` or ``(B, T)`` integer targets matching ``logits.shape[:-1]``.

    Returns:
        ``(N, C)`` logits and ``(N,)`` targets.

    Raises:
        ValueError: when the shapes do not match.
    """
    if tuple(logits.shape[:-1]) != tuple(y.shape):
        raise ValueError(f"logits {tuple(logits.shape)} do not match targets {tuple(y.shape)}")
    return logits.reshape(-1, logits.shape[-1]), y.reshape(-1)


def topk_correct(logits: Tensor, y: Tensor, ks: Sequence[int]) -> dict[int, int]:
    """Count examples whose target is among the ``k`` highest logits, for each ``k``.

    Args:
        logits: ``(N, C)`` scores.
        y: ``(N,)`` integer targets.
        ks: the ``k`` values (each >= 1); a ``k`` above ``C`` counts every example.

    Returns:
        ``{k: number of examples whose target is in the top k}``.
    """
    return {k: int(hit.sum()) for k, hit in topk_hits(logits, y, ks).items()}


def topk_hits(logits: Tensor, y: Tensor, ks: Sequence[int]) -> dict[int, Tensor]:
    """:func:`topk_correct` per example: ``{k: (N,) bool}``, whether the target of each row of
    ``logits`` is among its ``k`` highest."""
    if ks and min(ks) < 1:
        raise ValueError(f"top-k needs k >= 1, got {list(ks)}")
    if not ks or logits.shape[0] == 0:
        return {k: torch.zeros(logits.shape[0], dtype=torch.bool, device=logits.device) for k in ks}
    kmax = min(max(ks), logits.shape[-1])
    top = logits.topk(kmax, dim=-1).indices  # (N, kmax), highest first
    hit = top == y.unsqueeze(-1)  # (N, kmax) bool, at most one True per row
    cum = hit.cumsum(dim=-1)  # (N, kmax): 1 from the target's rank on
    return {k: cum[:, min(k, kmax) - 1] > 0 for k in ks}


def accuracy_from_logits(logits: Tensor, y: Tensor) -> float:
    """Top-1 accuracy of ``(..., C)`` logits against ``(...)`` targets (NaN when empty).

    Args:
        logits: ``(B, C)`` or ``(B, T, V)`` scores.
        y: matching integer targets.

    Returns:
        The fraction of examples (tokens) whose arg-max is the target.
    """
    flat, target = flatten_logits(logits, y)
    if target.numel() == 0:
        return math.nan
    return float((flat.argmax(dim=-1) == target).double().mean())


def weighted_mean(values: Sequence[float], weights: Sequence[float]) -> float:
    """``sum(v * w) / sum(w)``; NaN when the weights sum to zero.

    Args:
        values: the values.
        weights: non-negative weights, one per value.

    Returns:
        The weighted mean.

    Raises:
        ValueError: when the lengths differ.
    """
    if len(values) != len(weights):
        raise ValueError(f"{len(values)} values but {len(weights)} weights")
    total = math.fsum(weights)
    if total == 0:
        return math.nan
    return math.fsum(v * w for v, w in zip(values, weights, strict=True)) / total


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Put ``model`` in eval mode for the block, then restore its previous mode."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def ensemble_log_probs(logits: Sequence[Tensor]) -> Tensor:
    """An ensemble's scores from its members' ``logits``: the log of their mean softmax (in
    float32, clamped at 1e-30 so no class scores -inf); cross-entropy and argmax on these are
    the ensemble's NLL and prediction."""
    probs = torch.stack([z.float().softmax(-1) for z in logits]).mean(0)
    return probs.clamp_min(1e-30).log()


def _scores(model: nn.Module, members: Sequence[Mapping[str, Tensor]], xb: Tensor) -> Tensor:
    """Logits of one model; for an ensemble, :func:`ensemble_log_probs` of its members'."""
    if len(members) == 1:
        return torch.func.functional_call(structure_for(model, members[0]), dict(members[0]), (xb,))
    return ensemble_log_probs(
        [torch.func.functional_call(structure_for(model, m), dict(m), (xb,)) for m in members]
    )


@dataclass(frozen=True)
class ExampleScores:
    """What one model got right and wrong on each example of a set: every subset's metrics are
    gathered from these, so an example shared by many subsets is run through the model once.

    Attributes:
        loss: ``(N,)`` or ``(N, T)`` float32 cross-entropy of each target (nats).
        correct: like ``loss``, bool: the arg-max is the target.
        topk: ``{k: like loss, bool: the target is among the k highest scores}``.
        keep: like ``loss``, bool: the target counts (not ``ignore_index``); ``None``: all do.
    """

    loss: Tensor
    correct: Tensor
    topk: Mapping[int, Tensor] = field(default_factory=dict)
    keep: Tensor | None = None

    @property
    def num_examples(self) -> int:
        return int(self.loss.shape[0])

    def over(self, rows: Tensor | None = None, *, batch_size: int = 2048) -> EvalResult:
        """The metrics of the examples ``rows`` (all, in order, when ``None``).

        ``rows`` may repeat an example: it then counts as many times as it appears. The sums run
        over consecutive blocks of ``batch_size`` rows, as :func:`evaluate` runs its batches, so
        ``score_examples(...).over(rows)`` equals ``evaluate`` on the gathered examples to the
        bit wherever the model scores an example the same in any batch (see docs/internals.md).

        Args:
            rows: ``(M,)`` int64 indices into the examples, or ``None``.
            batch_size: rows per partial sum.

        Returns:
            The :class:`EvalResult`; no rows give NaN loss and accuracies.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        total = self.num_examples if rows is None else len(rows)
        n, loss_sum, correct = 0, 0.0, 0
        hits = dict.fromkeys(self.topk, 0)
        for start in range(0, total, batch_size):
            pick: slice | Tensor = (
                slice(start, start + batch_size)
                if rows is None
                else rows[start : start + batch_size].to(self.loss.device)
            )
            keep = None if self.keep is None else self.keep[pick].reshape(-1)

            def take(
                values: Tensor, keep: Tensor | None = keep, pick: slice | Tensor = pick
            ) -> Tensor:
                flat = values[pick].reshape(-1)
                return flat if keep is None else flat[keep]

            losses = take(self.loss)
            n += losses.numel()
            loss_sum += float(losses.double().sum())
            correct += int(take(self.correct).sum())
            for k, hit in self.topk.items():
                hits[k] += int(take(hit).sum())
        if n == 0:
            return EvalResult(0, math.nan, math.nan, dict.fromkeys(self.topk, math.nan))
        return EvalResult(n, loss_sum / n, correct / n, {k: h / n for k, h in hits.items()})


def _members(
    params: Mapping[str, Tensor] | Sequence[Mapping[str, Tensor]],
) -> list[Mapping[str, Tensor]]:
    members = [params] if isinstance(params, Mapping) else list(params)
    if not members:
        raise ValueError("evaluate needs parameters (or at least one ensemble member)")
    return members


def score_examples(
    model: nn.Module,
    params: Mapping[str, Tensor] | Sequence[Mapping[str, Tensor]],
    x: Tensor,
    y: Tensor,
    *,
    batch_size: int = 2048,
    topk: Sequence[int] = (),
    ignore_index: int | None = None,
) -> ExampleScores:
    """Run ``model`` with ``params`` on ``(x, y)`` in batches and keep each example's result.

    Arguments as :func:`evaluate` (its defaults are these). The per-example tensors live on the
    parameters' device; ``N`` examples cost ``N`` forwards, whatever number of subsets is gathered
    from them later.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if topk and min(topk) < 1:
        raise ValueError(f"top-k needs k >= 1, got {list(topk)}")
    members = _members(params)
    first = members[0]
    device = next(iter(first.values())).device if first else x.device
    losses, correct, keeps = [], [], []
    hits: dict[int, list[Tensor]] = {k: [] for k in topk}
    with torch.inference_mode(), _eval_mode(model):
        for start in range(0, len(x), batch_size):
            xb = x[start : start + batch_size].to(device)
            yb = y[start : start + batch_size].to(device)
            logits = _scores(model, members, xb)
            flat, target = flatten_logits(logits, yb)  # (B*, C), (B*,)
            ce_ignore = -100 if ignore_index is None else ignore_index
            loss = F.cross_entropy(flat.float(), target, reduction="none", ignore_index=ce_ignore)
            losses.append(loss.reshape(yb.shape))  # (B,) or (B, T)
            correct.append((flat.argmax(dim=-1) == target).reshape(yb.shape))
            for k, hit in topk_hits(flat, target, topk).items():
                hits[k].append(hit.reshape(yb.shape))
            if ignore_index is not None:
                keeps.append(yb != ignore_index)
    empty = torch.zeros((0, *y.shape[1:]), device=device)
    return ExampleScores(
        torch.cat(losses) if losses else empty.float(),
        torch.cat(correct) if correct else empty.bool(),
        {k: torch.cat(v) if v else empty.bool() for k, v in hits.items()},
        (torch.cat(keeps) if keeps else empty.bool()) if ignore_index is not None else None,
    )


class EvalOptions(TypedDict, total=False):
    """The keyword arguments of :func:`evaluate`, as :func:`score_examples` takes them."""

    batch_size: int
    topk: Sequence[int]
    ignore_index: int | None


def evaluate(
    model: nn.Module,
    params: Mapping[str, Tensor] | Sequence[Mapping[str, Tensor]],
    x: Tensor,
    y: Tensor,
    **options: Unpack[EvalOptions],
) -> EvalResult:
    """Evaluate ``model`` run with ``params`` on ``(x, y)`` in batches.

    The loss is the cross-entropy summed over all examples (tokens), then divided by ``n``, so
    the result does not depend on ``batch_size``. Inputs are moved to the parameters' device.

    Args:
        model: the architecture (its own parameters are not used where ``params`` names them);
            a progressive model (ProgFed) runs the sub-model the parameters describe.
        params: parameters by name, as ``model.named_parameters()`` names them; or a list of
            such mappings, evaluated as an ensemble (the mean of the members' softmax outputs).
        x: inputs, ``(N, ...)``.
        y: targets, ``(N,)`` for classification or ``(N, T)`` for sequences.
        options: ``batch_size`` (examples per forward pass, default 2048); ``topk`` (``k``
            values for top-k accuracy, e.g. ``(3,)`` for next-word prediction); ``ignore_index``
            (target value to leave out, e.g. padding tokens; default ``None``).

    Returns:
        The :class:`EvalResult`; ``n == 0`` gives NaN loss and accuracies.
    """
    batch_size = options.get("batch_size", 2048)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    _members(params)
    if len(x) == 0:  # e.g. a client without a test split: no mode switches, no passes
        return EvalResult(0, math.nan, math.nan, dict.fromkeys(options.get("topk", ()), math.nan))
    return score_examples(model, params, x, y, **options).over(batch_size=batch_size)
