"""FedBIAD's local variational objective (Algorithm 1, lines 9 and 16-17; Eqs. 2-7, 13).

Each local step of client ``k`` at round ``r``:

* forward pass ``θ = β ∘ (U + s̃ε)`` with fresh ``ε ~ N(0, I)`` per step and ``s̃²`` of Eq. 13
  (numerically a no-op in fp32; logged as ``fedbiad/s2``); dropped rows are zero and frozen
  (their gradient is zero; with momentum or weight decay they are also restored after each step,
  Eq. 7);
* loss ``mean CE + KL/(α·m)`` with ``KL = ½ Σ_{kept rows} ‖μ_j‖²`` (the N(0, 1) slab; ``kl:
  false`` drops it). ``n_k`` = the client's likelihood terms, the targets the mean CE averages
  over: ``|D_k|`` for one label per example, ``|D_k|·T`` for next-token sequences ``y (n, T)``
  (Eq. 2 has one likelihood factor per target; dividing by ``α|D_k|`` alone would weigh the KL
  T times too much against the per-token mean CE). ``m`` (Eq. 2's "number of samples", left open):
  ``kl_samples: seen`` (default) ``m = r·V·n_k``, the data the tempered posterior has absorbed
  by round ``r`` (Theorem 1's ``m_r``, the ``m`` of Eq. 13 below); ``client``: ``m = n_k`` (Eq.
  5 read per round). ``client`` is an L2 pull of ``1/(α|D_k|) ≈ 0.036`` per step at MNIST's 56
  examples per client and costs 8 points there (86.2 vs 93.5%, 3 seeds; ``seen`` and ``kl:
  false`` both reach 93.5%), so it cannot give the paper's numbers.

Eq. 13 inputs at a client (the paper defines them only for its MLP): ``d`` = size of one input
example, ``D`` = the widest non-output row layer, ``L`` = number of row layers (``rows(model)``),
``J`` = all rows of the model, ``S = (1 − p)·J·D``, ``m = r·V·|D_k|`` (the client's own example
count stands in for ``min_k |D_k|``, which no client knows), ``V`` = local steps this round.

The step's per-client tensors (``full`` of the local job, see ``_jobs``): ``rows.<param>`` the
entry mask ``β`` expands to, ``eps.<param>`` the weight noise ``ε``, ``s_tilde`` and
``kl_coef`` the KL weight ``1/(α·m)``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Protocol

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm import philox
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.context import ClientData
from fedcomm.models import dropout
from fedcomm.models.groups import GroupSpec, expand_mask, rows
from fedcomm.types import ParamDict

# a client's per-step tensors in its local job: row masks of β per parameter, the weight noise ε,
# s̃ and the KL weight 1/(α·n_k) (n_k: likelihood terms, see likelihood_terms)
ROW, EPS, S_TILDE, KL_COEF = "rows.", "eps.", "s_tilde", "kl_coef"
LOGIT_KEEP = "logit_keep"  # (V,) the output layer's kept rows, for softmax_rows: kept


class KLConfig(Protocol):
    """The config fields :func:`kl_weight` reads (``fedbiad.Config``)."""

    @property
    def kl(self) -> bool: ...
    @property
    def kl_samples(self) -> str: ...
    @property
    def alpha(self) -> float: ...


# --- Eq. 13: the posterior variance s̃² ----------------------------------------------------------


def posterior_variance(S: float, m: float, d: float, D: float, L: float, B: float) -> float:
    """Eq. 13: ``s̃² = S/(16 m d²) · log(3D)⁻¹ · (2BD)^{−2L} ·
    {(d + 1 + 1/(BD−1))² + 1/((BD)² − 1) + 2/(BD − 1)²}⁻¹`` (in log space: may underflow to 0)."""
    bd = B * D
    brace = (d + 1 + 1 / (bd - 1)) ** 2 + 1 / (bd**2 - 1) + 2 / (bd - 1) ** 2
    log_s2 = (
        math.log(S)
        - math.log(16 * m * d * d)
        - math.log(math.log(3 * D))
        - 2 * L * math.log(2 * bd)
        - math.log(brace)
    )
    return math.exp(log_s2)


def model_variance(
    model: nn.Module, p: float, B: float, d: int, round_: int, steps: int, n: int
) -> float:
    """Eq. 13 with the inputs read off ``model`` (see the module docstring)."""
    all_rows = rows(model)
    hidden = [s.count for s in all_rows if not s.is_output] or [s.count for s in all_rows]
    width, depth = max(hidden), len(all_rows)
    total = sum(s.count for s in all_rows)
    m = max(1, round_) * max(1, steps) * max(1, n)
    return posterior_variance((1 - p) * total * width, m, max(1, d), width, depth, B)


# --- Eqs. 2 and 5: the KL term's weight ----------------------------------------------------------


def likelihood_terms(y: Tensor) -> int:
    """The likelihood factors of a client's data, the targets the mean CE averages over
    (``_local.cross_entropy`` counts every target, there is no padding index): ``n`` for labels
    ``y (n,)``, ``n·T`` for next-token targets ``y (n, T)``. The KL weight is ``1/(α·this)``."""
    return int(y.numel())


def kl_weight(cfg: KLConfig, terms: int, round_: int, steps: int) -> float:
    """The KL's weight ``1/(α·m)`` against the mean CE: ``m`` = the client's likelihood terms
    (``kl_samples: client``, Eq. 5 with ``m = |D_k|``), or ``r·V`` times that (``seen``: Theorem
    1's ``m_r = r·V·|D_k|``, the data the posterior has absorbed by round ``r``); 0 without KL."""
    if not cfg.kl:
        return 0.0
    m = max(1, terms) * (max(1, round_) * max(1, steps) if cfg.kl_samples == "seen" else 1)
    return 1.0 / (cfg.alpha * m)


# --- the local step's hooks (pure functions of full = frozen | live) ----------------------------


def kept_scale(mask: Tensor) -> Tensor:
    """``rows / kept`` of one parameter's row mask (every row has the same entries, so the
    entries' ratio is the rows'): inverted dropout's ``1 / (1 − p)`` up to rounding."""
    return mask.numel() / mask.sum().clamp_min(1.0)


def perturbed_params(
    names: Sequence[str],
    full: dict[str, Tensor],
    *,
    rescale: bool = False,
    output_weight: str | None = None,
) -> dict[str, Tensor]:
    """Algorithm 1, line 16: the forward parameters ``θ = β ∘ (U + s̃ε)``; with ``rescale``
    (``rescale_rows``, a reading) the kept rows times ``rows / kept``; with ``output_weight``
    (``softmax_rows: kept``) also ``LOGIT_KEEP``, the output layer's row mask, for the loss's
    softmax over the kept rows."""
    out = dict(full)
    for n in names:
        t = torch.addcmul(full[n], full[S_TILDE], full[EPS + n])  # one pass, fused
        if ROW + n in full:
            mask = full[ROW + n]
            t = t * (mask * kept_scale(mask) if rescale else mask)
        out[n] = t
    if output_weight is not None:
        out[LOGIT_KEEP] = full[ROW + output_weight][:, 0]  # (V,) 1 kept / 0 dropped
    return out


def kl_term(rowed: set[str], full: Mapping[str, Tensor], loss: Tensor) -> Tensor:
    """Eqs. 2/5: ``loss + ½ Σ_{kept rows} ‖μ_j‖² / (α·m)`` (the N(0, 1) slab's KL)."""
    sq = [((full[n] * full[ROW + n]) if ROW + n in full else full[n]).pow(2).sum()
          for n in rowed]  # fmt: skip
    return loss + full[KL_COEF] * 0.5 * torch.stack(sq).sum()


def frozen_rows(
    live: dict[str, Tensor], frozen: Mapping[str, Tensor], before: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Eq. 7: dropped rows stay frozen (restored after a step with momentum / weight decay)."""
    return {
        k: torch.where(frozen[ROW + k].bool(), v, before[k]) if ROW + k in frozen else v
        for k, v in live.items()
    }


def output_weight(model: nn.Module) -> str:
    """The output layer's weight (``(V, H)``: one row per class), the last row layer's."""
    spec = next(s for s in reversed(rows(model)) if s.is_output)
    return next(n for n in spec.param_names if n.endswith("weight"))


def local_program(
    model: nn.Module,
    kl: bool,
    freeze: bool,
    *,
    rescale: bool = False,
    softmax_kept: bool = False,
) -> _jobs.LocalProgram:
    """The local step for ``model``'s structure: the perturbed forward pass, the KL on every
    row of the model (``kl``), dropped rows restored after each step (``freeze``); the kept
    rows scaled by ``rows / kept`` (``rescale``); the loss's softmax over the output layer's
    kept rows only (``softmax_kept``, needs the output layer droppable)."""
    names = [n for n, _ in model.named_parameters()]
    rowed = {n for s in rows(model) for n in s.param_names}  # the KL's rows (all of them)
    out_w = output_weight(model) if softmax_kept else None
    return _jobs.LocalProgram(
        loss_hook=partial(kl_term, rowed) if kl and rowed else None,
        param_map=partial(perturbed_params, names, rescale=rescale, output_weight=out_w),
        post_step=frozen_rows if freeze else None,
        post_reads_old=freeze,
        logit_mask=LOGIT_KEEP if softmax_kept else None,
    )


# --- Eq. 8's loss over the client's data (``loss_trend: data``) ---------------------------------


@torch.no_grad()
def local_data_loss(
    model: nn.Module,
    data: ClientData,
    chunk: int,
    live: Mapping[str, Tensor],
    frozen: Mapping[str, Tensor],
) -> float:
    """``L^k(π̃^{k,i})`` of Eq. 8 read over the client's whole local data ``D^k``: the mean CE
    (per target token for sequences) of the masked posterior mean ``θ = β ∘ U`` (the noise
    ``s̃ε`` is numerically a no-op, see the module docstring), in chunks of ``chunk`` examples.
    ``live``: ``U`` after the step; ``frozen``: the step's ``rows.<param>`` masks (``β``)."""
    theta = {k: v * frozen[ROW + k] if ROW + k in frozen else v for k, v in live.items()}
    total, terms = 0.0, 0
    for start in range(0, data.num_examples, chunk):
        x, y = data.x[start : start + chunk], data.y[start : start + chunk]
        with dropout.disabled(model):  # a measurement: the whole network, no draw
            logits = functional_call(model, theta, (x,))
        total += float(_local.cross_entropy(logits, y)) * y.numel()
        terms += y.numel()
    return total / max(1, terms)


# --- a client's per-step tensors -------------------------------------------------------------


def row_masks(
    specs: Sequence[GroupSpec], pattern: Mapping[str, Tensor], like: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """``rows.<param>``: the entry masks ``β`` expands to, in ``like``'s dtype."""
    return {
        ROW + n: m.to(like[n].dtype)
        for s in specs
        for n, m in expand_mask(s, pattern[s.name], like).items()
    }


def weight_noise(
    params: Mapping[str, Tensor], like: Mapping[str, Tensor], s_tilde: float, gen: torch.Generator
) -> ParamDict:
    """``eps.<param>``: one step's ``ε ~ N(0, I)`` per parameter, in parameter order, drawn on
    the client's (CPU) generator so the draws are the same on any device; zeros when ``s̃ = 0``."""
    if s_tilde > 0:
        return {
            EPS + n: torch.randn(p.shape, generator=gen, dtype=p.dtype, device=gen.device).to(
                like[n].device
            )
            for n, p in params.items()
        }
    return {EPS + n: torch.zeros_like(p) for n, p in params.items()}


def counter_noise(
    params: Mapping[str, Tensor], like: Mapping[str, Tensor], s_tilde: float, key: tuple[int, int]
) -> Callable[[], ParamDict]:
    """``draws()`` of ``noise: counter``: step ``t``'s ``eps.<param>`` for the ``i``-th
    parameter is :func:`fedcomm.philox.normal` at ``(key, t, i)``, drawn where ``like[param]``
    lives (no host copy; the same words on every device, see :mod:`fedcomm.philox`)."""
    steps = itertools.count()

    def draw() -> ParamDict:
        t = next(steps)
        if s_tilde <= 0:
            return {EPS + n: torch.zeros_like(like[n]) for n in params}
        return {
            EPS + n: philox.normal(p.numel(), key, t, i, device=like[n].device, dtype=p.dtype).view(
                p.shape
            )
            for i, (n, p) in enumerate(params.items())
        }

    return draw
