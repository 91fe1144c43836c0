"""FedBIAD's rows and dropping patterns ``β``: which rows can drop, how many each layer keeps,
the two stages' patterns and the score vector ``E`` (Algorithm 1, lines 10-26; Eqs. 8-9),
stage one's check after each local step included (:func:`stage_one_check`).

Rows (``models.groups.rows``): Linear ``W[j,:]`` + ``b[j]``, conv filters, the rows of the
recurrent layers' matrices with their bias rows (which matrices: ``lstm_rows``), embedding
dimensions; the output layer's rows only with ``drop_output_layer``. Every layer keeps exactly
``ceil((1 − p)·rows_l)`` rows (our default, ``pattern_scope: layer``; ``global`` keeps
``ceil((1 − p)·J)`` rows over all J rows, the paper's ``Z``, exactly ``ceil((1 − p)·rows_l)`` in
expectation per layer).

``lstm_rows`` (recurrent layers: LSTM, GRU, RNN): ``hh`` (default) drops rows of the recurrent
matrices ``weight_hh_l*`` (with ``bias_hh_l*``) only and always sends ``weight_ih_l*`` /
``bias_ih_l*`` whole; ``ih`` the reverse; ``both`` drops rows of every recurrent matrix. The paper
"adaptively drops partial weight rows for recurrent connections" and reports, at p = 0.5, 16.4 of
29.8 MB on PTB (1.82x) and 39.1 of 75.3 MB on WikiText-2; for its Embedding(10000, 300) -> 2x
LSTM(300) -> Linear(300, 10000) model (N = 7,454,800) ``hh`` uploads 32·4,088,600 + 12,700 =
130,847,900 bits (16.36 of 29.82 MB, 1.823x; with the ~28.9k-word vocabulary that makes the
model 75.3 MB, 39.1 MB: both of the paper's sizes at its rounding), ``both`` 32·3,727,400 +
15,100 = 119,291,900 bits (14.91 MB, 2.00x), ``both`` without ``drop_output_layer`` 1.42x:
neither matches. (``ih`` uploads as much as ``hh`` when the LSTM's input and hidden sizes are
equal; ``hh`` is the paper's "recurrent connections".)

Patterns are ``{layer: (rows_l,) bool}``. Stage two's rule is the sub-model dropout family's
score-ranked rule (:func:`~fedcomm.algorithms.submodel.units.by_score`, composed with
``select``): each layer's rows by descending score ``E``, ties at random, the first
``ceil((1 − p)·rows_l)`` kept.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from fedcomm.algorithms.fedbiad.bayes import row_masks
from fedcomm.algorithms.submodel.units import by_score, keep_ranked, score_ranking, select
from fedcomm.models.groups import GroupSpec, rows
from fedcomm.types import ParamDict

_RECURRENT = re.compile(r"weight_(ih|hh|hr)_l\d+(?:_reverse)?")  # nn.RNNBase's matrices


# --- the droppable rows -----------------------------------------------------------------------


def recurrent_matrix(spec: GroupSpec) -> str | None:
    """``"ih"``, ``"hh"`` (or ``"hr"``, an LSTM projection) for the rows of a recurrent layer's
    matrix ``weight_ih_l{k}`` / ``weight_hh_l{k}`` (``_reverse`` too), None for other rows."""
    match = _RECURRENT.fullmatch(spec.members[0][0].rsplit(".", 1)[-1])
    return match.group(1) if match else None


def row_specs(
    model: nn.Module | None,
    drop_output_layer: bool,
    lstm_rows: Literal["hh", "ih", "both", "none"] = "hh",
    drop_embedding: bool = True,
) -> tuple[GroupSpec, ...]:
    """The droppable row layers of ``model``: the output layer only with ``drop_output_layer``;
    of a recurrent layer's matrices only ``weight_hh`` (``lstm_rows="hh"``), only ``weight_ih``
    (``"ih"``), all of them (``"both"``) or none (``"none"``); embedding dimensions only with
    ``drop_embedding``. Parameters in no droppable row are sent whole."""
    if model is None:
        raise ValueError("fedbiad needs the model structure in the round context")
    embeddings = {f"{n}.weight" if n else "weight" for n, m in model.named_modules()
                  if isinstance(m, nn.Embedding)}  # fmt: skip
    return tuple(
        s
        for s in rows(model)
        if (drop_output_layer or not s.is_output)
        and (drop_embedding or s.members[0][0] not in embeddings)
        and (
            recurrent_matrix(s) is None
            or lstm_rows == "both"
            or (lstm_rows != "none" and recurrent_matrix(s) == lstm_rows)
        )
    )


def validate_model(model: nn.Module) -> None:
    if not rows(model):
        raise ValueError(f"fedbiad: {type(model).__name__} has no weight rows to drop")


def kept_count(count: int, p: float) -> int:
    """``ceil((1 − p)·count)`` (guarded against float noise such as 0.7·10 = 7.000000000000001)."""
    return max(1, math.ceil(round((1.0 - p) * count, 9))) if count else 0


def keep_counts(specs: Sequence[GroupSpec], p: float) -> dict[str, int]:
    """Rows kept per layer: ``ceil((1 − p)·rows_l)``."""
    return {s.name: kept_count(s.count, p) for s in specs}


def _split(flat: Tensor, specs: Sequence[GroupSpec]) -> dict[str, Tensor]:
    """A ``(J,)`` mask over all rows back to ``{layer: (rows_l,)}``."""
    return dict(zip([s.name for s in specs], flat.split([s.count for s in specs]), strict=True))


# --- the selection rules: {layer: keep count} -> {layer: (rows_l,) bool} ----------------------


def random_rows(count: int, k: int, generator: torch.Generator) -> Tensor:
    """Bool ``(count,)`` mask of ``k`` rows drawn uniformly without replacement."""
    return keep_ranked(
        torch.randperm(count, generator=generator, device=generator.device), k, count
    )


def top_rows(scores: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Bool mask of the ``k`` highest scores, ties broken uniformly at random."""
    return keep_ranked(score_ranking(scores, generator), k, scores.numel())


# --- the two stages' patterns ------------------------------------------------------------------


def random_pattern(
    specs: Sequence[GroupSpec], p: float, generator: torch.Generator, scope: str = "layer"
) -> dict[str, Tensor]:
    """Stage one's ``β``, uniformly random: exactly ``ceil((1 − p)·rows_l)`` per layer
    (``layer``), or ``ceil((1 − p)·J)`` over all J rows (``global``)."""
    if scope == "global":
        total = sum(s.count for s in specs)
        return _split(random_rows(total, kept_count(total, p), generator), specs)
    return {s.name: random_rows(s.count, kept_count(s.count, p), generator) for s in specs}


def score_pattern(
    specs: Sequence[GroupSpec],
    scores: Mapping[str, Tensor],
    p: float,
    generator: torch.Generator,
    scope: str = "layer",
) -> dict[str, Tensor]:
    """Stage two's ``β``: the top rows by ``E`` per layer (``layer``) or over all rows
    (``global``), exactly as many as :func:`random_pattern` keeps."""
    if scope == "global":
        flat = torch.cat([scores[s.name] for s in specs])
        return _split(top_rows(flat, kept_count(flat.numel(), p), generator), specs)
    return select(specs, keep_counts(specs, p), by_score(scores, generator))  # the family's rule


# --- stage one's loss trend and the score vector E ----------------------------------------------


def is_check_point(v: int, tau: int) -> bool:
    """Algorithm 1, line 18: ``v > τ`` and ``v mod τ = 0`` (i.e. ``v = 2τ, 3τ, …``)."""
    return v > tau and v % tau == 0


def trend(losses: Sequence[float], tau: int) -> float:
    """Eq. 8 as a mean: ``mean(last τ losses) − mean(the τ before)``."""
    if len(losses) < 2 * tau:
        raise ValueError(f"trend needs 2τ = {2 * tau} losses, got {len(losses)}")
    last, before = losses[len(losses) - tau :], losses[len(losses) - 2 * tau : len(losses) - tau]
    return sum(last) / tau - sum(before) / tau


def score_update(
    losses_window: Sequence[float], beta_now: Tensor, beta_next: Tensor, scores: Tensor
) -> Tensor:
    """Eq. 9 at a check point, from the last ``2τ`` losses: every row held now (``β^v_j = 1``)
    gains 1 if ``ΔL ≤ 0``, else ``1[β^{v+1}_j = 1]``. Returns new scores."""
    if len(losses_window) % 2:
        raise ValueError("losses_window must hold 2τ losses")
    delta = trend(losses_window, len(losses_window) // 2)
    gain = torch.ones_like(scores) if delta <= 0 else beta_next.to(scores.dtype)
    return scores + beta_now.to(scores.dtype) * gain


def initial_scores(specs: Sequence[GroupSpec], held: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``E^k`` at the start of a round: a copy of the client's ``held`` scores, zeros for layers
    it never scored (its first participation)."""
    return {  # row scores live with the draws, on the CPU
        s.name: held[s.name].clone() if s.name in held else torch.zeros(s.count, device="cpu")
        for s in specs
    }


# --- stage one, after each local step: Algorithm 1, lines 18-26 --------------------------------


@dataclass
class Track:
    """A client's pattern state during its local training (host side, between steps)."""

    beta: dict[str, Tensor]  # β: (rows_l,) bool per layer
    scores: dict[str, Tensor]  # E: (rows_l,) float per layer
    losses: list[float] = field(default_factory=list)  # ℓ_0, ℓ_1, … (stage one)
    resamples: int = 0


def stage_one_check(
    specs: Sequence[GroupSpec],
    p: float,
    tau: int,
    scope: str,
    generator: torch.Generator,
    like: Mapping[str, Tensor],
    track: Track,
    v: int,
    loss: float,
    live: Mapping[str, Tensor],
    frozen: Mapping[str, Tensor],
    idx: Tensor,
    *,
    data_loss: Callable[[Mapping[str, Tensor], Mapping[str, Tensor]], float] | None = None,
) -> tuple[ParamDict, ParamDict] | None:
    """Algorithm 1, lines 18-26, after step ``v`` of stage one (``_jobs.AfterStep``): at a check
    point (every ``τ`` steps from ``2τ``), resample ``β`` if the loss rose (Eq. 8; ``p`` and
    ``scope`` as :func:`random_pattern`) and update ``E`` (Eq. 9); returns the new row masks for
    the next steps. The trend's ``ℓ_v`` is the step's minibatch loss ``loss`` (``loss_trend:
    batch``), or ``data_loss(live, frozen)``, the loss over the client's whole data after the
    step (``loss_trend: data``)."""
    track.losses.append(loss if data_loss is None else data_loss(live, frozen))
    if not is_check_point(v, tau):
        return None
    window = track.losses[v - 2 * tau + 1 : v + 1]  # ℓ_{v−2τ+1..v}
    now = track.beta
    if trend(window, tau) > 0:  # Eq. 8: ΔL > 0
        nxt = random_pattern(specs, p, generator, scope)
        track.resamples += 1
    else:
        nxt = now
    track.scores = {  # Eq. 9
        s.name: score_update(window, now[s.name], nxt[s.name], track.scores[s.name]) for s in specs
    }
    track.beta = nxt
    return {}, row_masks(specs, nxt, like)
