"""FedBIAD: Bayesian inference-based adaptive dropout of weight rows.

Xue et al., "FedBIAD: Communication-Efficient and Accuracy-Guaranteed Federated Learning with
Bayesian Inference-Based Adaptive Dropout", IPDPS 2023 (Algorithm 1, Eqs. 2-10, 13);
implementation choices from ``specs/fedsparse-fedbiad.md`` §0, §2.1-2.4, §2.7-2.8.

Rows (``models.groups.rows``): Linear ``W[j,:]`` + ``b[j]``, conv filters, the rows of the
recurrent layers' matrices with their bias rows (which matrices: ``lstm_rows``), embedding
dimensions; the output layer's rows only with ``drop_output_layer``. Every layer keeps exactly
``ceil((1 − p)·rows_l)`` rows (spec Rec, ``pattern_scope: layer``; ``global`` keeps
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

Client ``k``, round ``r`` (persistent score vector ``E^k``, one float per row, from 0):

* forward pass ``θ = β ∘ (U + s̃ε)`` with fresh ``ε ~ N(0, I)`` per step and ``s̃²`` of Eq. 13
  (numerically a no-op in fp32; logged as ``fedbiad/s2``); dropped rows are zero and frozen
  (their gradient is zero; with momentum or weight decay they are also restored after each step);
* loss ``mean CE + KL/(α·m)`` with ``KL = ½ Σ_{kept rows} ‖μ_j‖²`` (the N(0, 1) slab; ``kl:
  false`` drops it). ``n_k`` = the client's likelihood terms, the targets the mean CE averages
  over: ``|D_k|`` for one label per example, ``|D_k|·T`` for next-token sequences ``y (n, T)``
  (Eq. 2 has one likelihood factor per target; dividing by ``α|D_k|`` alone would weigh the KL
  T times too much against the per-token mean CE). ``m`` ([AMB]: Eq. 2's "number of samples"):
  ``kl_samples: seen`` (default) ``m = r·V·n_k``, the data the tempered posterior has absorbed
  by round ``r`` (Theorem 1's ``m_r``, the ``m`` of Eq. 13 below); ``client``: ``m = n_k`` (Eq.
  5 read per round). ``client`` is an L2 pull of ``1/(α|D_k|) ≈ 0.036`` per step at MNIST's 56
  examples per client and costs 8 points there (86.2 vs 93.5%, 3 seeds; ``seen`` and ``kl:
  false`` both reach 93.5%), so it cannot give the paper's numbers;
* stage one (``r ≤ R_b``): a random pattern ``β``; at iterations ``v = 2τ, 3τ, …`` the trend
  ``ΔL = mean(ℓ_{v−τ+1..v}) − mean(ℓ_{v−2τ+1..v−τ})`` (Eq. 8); ``ΔL > 0`` resamples ``β`` for the
  next ``τ`` iterations; the scores of the rows held at ``v`` are updated by Eq. 9 (only at these
  check points, spec Rec);
* stage two (``r > R_b``): the top ``ceil((1 − p)·rows_l)`` rows of each layer by ``E`` (ties at
  random), fixed for the round;
* upload ``β^{k,V}`` (1 bit per row, all J rows) and the kept rows' values (32 bits each); the
  parameters in no droppable row (GroupNorm, the output layer without ``drop_output_layer``, the
  recurrent matrices ``lstm_rows`` leaves out) densely.

Server (``aggregation``; Eq. 10 reads three ways, spec §2.3 [AMB]):

* ``masked`` (default): per row, the ``|D_k|``-weighted mean over the clients that kept it; rows
  nobody kept stay ``U_{r−1}`` (the FedDrop/HeteroFL/FjORD convention);
* ``fill``: Eq. 10 over each client's *complete* parameters, its dropped rows reconstructed as
  ``U_{r−1}`` (each row's update damped by the share of clients that kept it);
* ``eq10``: Eq. 10 as printed, ``U_r = Σ_k |D_k| β_k ∘ U_k / Σ_k |D_k|``: a dropped row counts as
  0, so every row shrinks by about ``(1 − p)`` a round. It cannot give the paper's own numbers
  (the MNIST profile: 75.4 ± 0.7% vs ``masked``'s 93.5 ± 0.1%, 3 seeds; on 1000 IID clients,
  issue 15's check, it falls to 10% by round 60 with ``‖fc1.W‖ → 0.002``, with or without the
  KL), so it is not the default; kept as the literal reading (``docs/reproductions/fedbiad.md``).

``next_columns``: the next layer's input columns that read a dropped row are sent whole, but
no gradient reaches them at that client (their input is 0); ``all`` (default: Eq. 10 over the
uploaded weights) averages them over every client, ``holders`` over the clients that kept the
row (FedDrop's rule; sequential mlp/cnn only; the server's rule alone, the bits are the same).
The averaging rule gives ``Δ = U_agg − U_{r−1}``, and
``U_r = U_{r−1} + server_opt(Δ)`` (default ``sgd``, lr 1: exactly the rule above). The download
is the dense ``U_{r−1}`` (32·N bits); the global model evaluated is ``θ = U_r``.

Eq. 13 inputs at a client ([AMB], the paper defines them for its MLP): ``d`` = size of one input
example, ``D`` = the widest non-output row layer, ``L`` = number of row layers (``rows(model)``),
``J`` = all rows of the model, ``S = (1 − p)·J·D``, ``m = r·V·|D_k|`` (the client's own example
count stands in for ``min_k |D_k|``, which no client knows), ``V`` = local steps this round.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from fedcomm.algorithms import _jobs, _local, feddrop
from fedcomm.algorithms._grouped import decode_groups, encode_groups, entry_masks
from fedcomm.algorithms.base import (
    AlgorithmConfig,
    ClientContext,
    ClientData,
    ClientResult,
    FedAlgorithm,
    RoundContext,
    Uplink,
    client_weights,
    clone_params,
    register,
    weighted_mean,
)
from fedcomm.comm.codecs import encode_dense
from fedcomm.comm.payload import Entry, Free, Payload
from fedcomm.models.groups import GroupSpec, expand_mask, rows
from fedcomm.server_opt import OptState, apply_step
from fedcomm.types import Params

MASK = "mask/"  # f"mask/{spec}": β of one row layer, 1 bit per row (comm.payload.Mask)
KEEP = "keep/"  # f"keep/{param}": the entry mask β expands to (Free: the receiver rebuilds it)
# a client's per-step tensors in its local job: row masks of β per parameter, the weight noise ε,
# s̃ and the KL weight 1/(α·n_k) (n_k: likelihood terms, see likelihood_terms)
ROW, EPS, S_TILDE, KL_COEF = "rows.", "eps.", "s_tilde", "kl_coef"


@dataclass
class _Track:
    """A client's pattern state during its local training (host side, between steps)."""

    beta: dict[str, Tensor]
    scores: dict[str, Tensor]
    resamples: int = 0


class Config(AlgorithmConfig):
    name: Literal["fedbiad"] = "fedbiad"
    p: float = Field(0.2, ge=0, lt=1, description="fraction of rows dropped")
    stage_boundary: int = Field(55, ge=0, description="R_b: rounds r ≤ R_b are stage one")
    tau: int = Field(3, ge=1, description="τ: iterations per loss-trend window")
    drop_output_layer: bool = True
    lstm_rows: Literal["hh", "ih", "both"] = Field(
        "hh",
        description=(
            "droppable rows of recurrent (LSTM) layers: 'hh' only weight_hh_l* (+ bias_hh) "
            "rows, weight_ih always sent whole; 'ih' the reverse; 'both' every matrix. 'hh' "
            "reproduces the paper's LM upload at p = 0.5 (PTB 16.4 of 29.8 MB, 1.82x; 'both' "
            "gives 2.00x)"
        ),
    )
    aggregation: Literal["masked", "fill", "eq10"] = Field(
        "masked", description="Eq. 10's reading: masked (default), fill, or eq10 as printed"
    )
    alpha: float = Field(0.5, gt=0, le=1, description="tempered-likelihood α")
    kl: bool = Field(True, description="the KL (L2 on kept rows) term; false: 'no KL' ablation")
    kl_samples: Literal["seen", "client"] = Field(
        "seen",
        description="m of the tempered posterior that weighs the KL, 1/(α·m): seen (default) = "
        "r·V times the client's likelihood terms, the data seen by round r (Theorem 1's m_r, "
        "the m of Eq. 13); client = the client's likelihood terms alone (Eq. 5 read per round: "
        "an L2 pull of 1/(α|D_k|) that costs 8 points on the MNIST profile)",
    )
    pattern_scope: Literal["layer", "global"] = "layer"
    B: int = Field(2, ge=2, description="weight bound B of Eq. 13")
    weighting: Literal["num_examples", "uniform"] = "num_examples"
    next_columns: Literal["all", "holders"] = Field(
        "all",
        description="the next layer's input columns that read a dropped row (sent whole, "
        "unchanged by the client): all (default: averaged over every client, as Eq. 10 over "
        "the uploaded weights) or holders (averaged over the clients that kept the row, "
        "FedDrop's convention; sequential mlp/cnn models only). Server-side only: same bits",
    )


@dataclass(frozen=True)
class ClientState:
    """Per-client, kept across rounds: the score vector ``E`` as ``(rows_l,)`` float per layer
    (empty before the first participation: all zeros)."""

    scores: Mapping[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerState:
    params: Params  # U
    opt_state: OptState
    specs: tuple[GroupSpec, ...]  # the droppable row layers


# --- pure pieces -------------------------------------------------------------------------------


_RECURRENT = re.compile(r"weight_(ih|hh|hr)_l\d+(?:_reverse)?")  # nn.RNNBase's matrices


def recurrent_matrix(spec: GroupSpec) -> str | None:
    """``"ih"``, ``"hh"`` (or ``"hr"``, an LSTM projection) for the rows of a recurrent layer's
    matrix ``weight_ih_l{k}`` / ``weight_hh_l{k}`` (``_reverse`` too), None for other rows."""
    match = _RECURRENT.fullmatch(spec.members[0][0].rsplit(".", 1)[-1])
    return match.group(1) if match else None


def row_specs(
    model: nn.Module | None,
    drop_output_layer: bool,
    lstm_rows: Literal["hh", "ih", "both"] = "hh",
) -> tuple[GroupSpec, ...]:
    """The droppable row layers of ``model``: the output layer only with ``drop_output_layer``;
    of a recurrent layer's matrices only ``weight_hh`` (``lstm_rows="hh"``), only ``weight_ih``
    (``"ih"``) or all of them (``"both"``). Parameters in no droppable row are sent whole."""
    if model is None:
        raise ValueError("fedbiad needs the model structure in the round context")
    return tuple(
        s
        for s in rows(model)
        if (drop_output_layer or not s.is_output)
        and (lstm_rows == "both" or recurrent_matrix(s) in (None, lstm_rows))
    )


def likelihood_terms(y: Tensor) -> int:
    """The likelihood factors of a client's data, the targets the mean CE averages over
    (``_local.cross_entropy`` counts every target, there is no padding index): ``n`` for labels
    ``y (n,)``, ``n·T`` for next-token targets ``y (n, T)``. The KL weight is ``1/(α·this)``."""
    return int(y.numel())


def kl_weight(cfg: Config, terms: int, round_: int, steps: int) -> float:
    """The KL's weight ``1/(α·m)`` against the mean CE: ``m`` = the client's likelihood terms
    (``kl_samples: client``, Eq. 5 with ``m = |D_k|``), or ``r·V`` times that (``seen``: Theorem
    1's ``m_r = r·V·|D_k|``, the data the posterior has absorbed by round ``r``); 0 without KL."""
    if not cfg.kl:
        return 0.0
    m = max(1, terms) * (max(1, round_) * max(1, steps) if cfg.kl_samples == "seen" else 1)
    return 1.0 / (cfg.alpha * m)


def validate_model(model: nn.Module) -> None:
    if not rows(model):
        raise ValueError(f"fedbiad: {type(model).__name__} has no weight rows to drop")


def kept_count(count: int, p: float) -> int:
    """``ceil((1 − p)·count)`` (guarded against float noise such as 0.7·10 = 7.000000000000001)."""
    return max(1, math.ceil(round((1.0 - p) * count, 9))) if count else 0


def keep_counts(specs: Sequence[GroupSpec], p: float) -> dict[str, int]:
    """Rows kept per layer: ``ceil((1 − p)·rows_l)``."""
    return {s.name: kept_count(s.count, p) for s in specs}


def random_pattern(
    specs: Sequence[GroupSpec], p: float, generator: torch.Generator, scope: str = "layer"
) -> dict[str, Tensor]:
    """A uniformly random ``β`` (bool ``(rows_l,)`` per layer): exactly ``ceil((1 − p)·rows_l)``
    per layer (``layer``), or ``ceil((1 − p)·J)`` over all J rows (``global``)."""
    if scope == "global":
        total = sum(s.count for s in specs)
        flat = torch.zeros(total, dtype=torch.bool, device=generator.device)
        flat[
            torch.randperm(total, generator=generator, device=generator.device)[
                : kept_count(total, p)
            ]
        ] = True
        return dict(zip([s.name for s in specs], flat.split([s.count for s in specs]), strict=True))
    out = {}
    for s in specs:
        mask = torch.zeros(s.count, dtype=torch.bool, device=generator.device)
        mask[
            torch.randperm(s.count, generator=generator, device=generator.device)[
                : kept_count(s.count, p)
            ]
        ] = True
        out[s.name] = mask
    return out


def top_rows(scores: Tensor, k: int, generator: torch.Generator) -> Tensor:
    """Bool mask of the ``k`` highest scores, ties broken uniformly at random."""
    perm = torch.randperm(scores.numel(), generator=generator, device=generator.device)
    order = torch.sort(scores[perm], descending=True, stable=True).indices
    mask = torch.zeros(scores.numel(), dtype=torch.bool, device=perm.device)
    mask[perm[order[:k]]] = True
    return mask


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
        mask = top_rows(flat, kept_count(flat.numel(), p), generator)
        return dict(zip([s.name for s in specs], mask.split([s.count for s in specs]), strict=True))
    return {s.name: top_rows(scores[s.name], kept_count(s.count, p), generator) for s in specs}


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


def aggregate(
    prev: Mapping[str, Tensor],
    values: Sequence[Mapping[str, Tensor]],
    kept: Sequence[Mapping[str, Tensor]],
    weights: Sequence[float],
    how: str,
) -> tuple[Params, dict[str, Tensor]]:
    """``(Δ, held)`` with ``U_agg = U_{r−1} + Δ``.

    ``values[k]`` are client k's decoded ``β_k ∘ U_k`` (zeros off its rows), ``kept[k]`` its bool
    entry masks (parameters absent: always sent). ``eq10``: ``Δ = Σ_k w_k (β_k ∘ U_k − U_{r−1}) /
    Σ_k w_k``; ``fill``: ``Σ_k w_k β_k (U_k − U_{r−1}) / Σ_k w_k`` (Eq. 10 over complete
    parameters, a dropped row reconstructed as ``U_{r−1}``); ``masked``: ``Σ_k w_k β_k (U_k −
    U_{r−1}) / Σ_k w_k β_k`` where some client kept the entry, 0 elsewhere (``held`` says
    where)."""
    everywhere = {k: torch.ones_like(t, dtype=torch.bool) for k, t in prev.items()}
    if how == "eq10":
        return weighted_mean([{k: v[k] - t for k, t in prev.items()} for v in values], weights), (
            everywhere
        )
    deltas = [
        {k: torch.where(km[k], v[k] - t, 0.0) if k in km else v[k] - t for k, t in prev.items()}
        for v, km in zip(values, kept, strict=True)
    ]
    mean = weighted_mean(deltas, weights)  # Σ_k w_k β_k δ_k / Σ_k w_k
    if how == "fill":  # every client's dropped rows reconstructed as U_{r−1} (a zero update)
        return mean, everywhere
    share = torch.tensor(weights, dtype=torch.float64, device=next(iter(prev.values())).device)
    share = share / sum(weights)
    out, held = {}, {}
    for k, m in mean.items():
        if not any(k in km for km in kept):
            out[k], held[k] = m, everywhere[k]
            continue
        stacked = torch.stack([km[k] if k in km else everywhere[k] for km in kept])  # (K, *shape)
        held[k] = stacked.any(0)
        frac = (stacked * share.view(-1, *[1] * m.dim())).sum(0).to(m.dtype).clamp_min(1e-12)
        out[k] = torch.where(stacked.all(0), m, m / frac)
    return out, held


def holder_masks(
    model: nn.Module | None,
    specs: Sequence[GroupSpec],
    beta: Mapping[str, Tensor],
    params: Mapping[str, Tensor],
) -> dict[str, Tensor]:
    """``next_columns: holders``: the entry masks of ``β`` plus, in the next layer, the input
    columns reading each dropped row (FedDrop's sub-model masks; every parameter present)."""
    layers = feddrop.unit_layers(model)  # ValueError for non-sequential models
    whole = {s.name: torch.ones(s.count, dtype=torch.bool, device="cpu") for s in layers}
    return feddrop.param_masks(layers, whole | {s.name: beta[s.name] for s in specs}, params)


def encode_upload(
    params: Mapping[str, Tensor], specs: Sequence[GroupSpec], beta: Mapping[str, Tensor]
) -> Payload:
    """``w/<param>``: kept rows' updates ``U_k − U_{r−1}`` (32 bits each; unrowed parameters
    whole; the update rather than the weights, so that uplink compressors such as DGC compress
    the update, as FedBIAD+DGC requires — the same bits), ``mask/<spec>``:
    ``β`` (1 bit per row), ``keep/<param>``: the entry masks ``β`` expands to (``Free``: the
    server rebuilds them from ``β`` and the model structure)."""
    entries: dict[str, Entry] = dict(encode_groups(params, specs, beta, send_masks=True))
    for name, m in entry_masks(specs, beta, params).items():
        entries[KEEP + name] = Free(m)
    return Payload(entries)


def uploaded_model(down: Mapping[str, Tensor], up: Mapping[str, Tensor]) -> Params:
    """``β_k ∘ U_k`` from the downloaded ``U_{r−1}`` and the sent updates: zeros on dropped
    rows (unrowed parameters: ``U_{r−1}`` + their update)."""
    out: Params = {}
    for name, ref in down.items():
        values = up[f"w/{name}"]
        keep = up.get(KEEP + name)
        if keep is None:
            out[name] = ref + values.reshape(ref.shape)
        else:
            out[name] = torch.zeros_like(ref)
            out[name][keep.bool()] = ref[keep.bool()] + values
    return out


# --- the algorithm -----------------------------------------------------------------------------


def make(cfg: Config) -> FedAlgorithm:
    opt = cfg.server.build()

    def init_server(params: Params, ctx: RoundContext) -> ServerState:
        specs = row_specs(ctx.model, cfg.drop_output_layer, cfg.lstm_rows)
        return ServerState(clone_params(params), opt.init(params), specs)

    def broadcast(
        state: ServerState, client_id: int, cstate: ClientState, ctx: RoundContext
    ) -> Payload:
        return encode_dense(state.params)  # 32·N

    def check_model(model: nn.Module) -> None:
        validate_model(model)
        if cfg.next_columns != "holders":
            return
        try:
            feddrop.unit_layers(model)  # the sequential chains holder_masks works on
        except ValueError:
            raise ValueError(
                "fedbiad: next_columns 'holders' needs a sequential model (mlp, cnn, "
                f"mnist_cnn), not {type(model).__name__}; use next_columns: all"
            ) from None

    programs: dict[tuple[int, bool], tuple[nn.Module, _jobs.LocalProgram]] = {}

    def program_for(model: nn.Module, freeze: bool) -> _jobs.LocalProgram:
        """The local step for this structure. Per client (``full``): the row masks of ``β``
        (``mask.<param>``), the weight noise ``ε`` (``eps.<param>``), ``s̃`` and the KL weight."""
        hit = programs.get((id(model), freeze))
        if hit is not None and hit[0] is model:
            return hit[1]
        names = [n for n, _ in model.named_parameters()]
        rowed = {n for s in rows(model) for n in s.param_names}  # the KL's rows (all of them)

        def forward_params(full: dict[str, Tensor]) -> dict[str, Tensor]:  # β ∘ (U + s̃ε)
            out = dict(full)
            for n in names:
                t = torch.addcmul(full[n], full[S_TILDE], full[EPS + n])  # one pass, fused
                out[n] = t * full[ROW + n] if ROW + n in full else t
            return out

        def kl_term(full: Mapping[str, Tensor], loss: Tensor) -> Tensor:  # + ½Σ_kept‖μ_j‖²/(α·n)
            sq = [((full[n] * full[ROW + n]) if ROW + n in full else full[n]).pow(2).sum()
                  for n in rowed]  # fmt: skip
            return loss + full[KL_COEF] * 0.5 * torch.stack(sq).sum()

        def frozen_rows(
            live: dict[str, Tensor], frozen: Mapping[str, Tensor], before: Mapping[str, Tensor]
        ) -> dict[str, Tensor]:  # Eq. 7: dropped rows stay frozen (momentum / weight decay)
            return {
                k: torch.where(frozen[ROW + k].bool(), v, before[k]) if ROW + k in frozen else v
                for k, v in live.items()
            }

        program = _jobs.LocalProgram(
            loss_hook=kl_term if cfg.kl and rowed else None,
            param_map=forward_params,
            post_step=frozen_rows if freeze else None,
            post_reads_old=freeze,
        )
        programs[(id(model), freeze)] = (model, program)
        return program

    def client_job(
        down: Mapping[str, Tensor], cstate: ClientState, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        model = ctx.model
        gen = ctx.generator
        specs = row_specs(model, cfg.drop_output_layer, cfg.lstm_rows)
        params = dict(model.named_parameters())
        names = list(params)
        scores = {
            s.name: cstate.scores[s.name].clone()
            if s.name in cstate.scores
            else torch.zeros(s.count, device="cpu")  # row scores live with the draws
            for s in specs
        }
        u0 = {k: down[k] for k in names}
        batches = _local.batch_schedule(data.num_examples, ctx.local, gen)
        s2 = model_variance(
            model, cfg.p, cfg.B, int(data.x[0].numel()) if data.num_examples else 1,
            ctx.round_, len(batches), data.num_examples,
        )  # fmt: skip
        s_tilde = math.sqrt(s2)
        stage_one = ctx.round_ <= cfg.stage_boundary
        if stage_one:
            beta = random_pattern(specs, cfg.p, gen, cfg.pattern_scope)
        else:
            beta = score_pattern(specs, scores, cfg.p, gen, cfg.pattern_scope)
        kl_coef = kl_weight(cfg, likelihood_terms(data.y), ctx.round_, len(batches))
        freeze = ctx.local.momentum > 0 or ctx.local.weight_decay > 0
        track = _Track(beta, scores)
        losses: list[float] = []

        def masks_of(pattern: Mapping[str, Tensor]) -> dict[str, Tensor]:
            return {
                ROW + n: m.to(u0[n].dtype)
                for s in specs
                for n, m in expand_mask(s, pattern[s.name], u0).items()
            }

        def draws() -> dict[str, Tensor]:  # ε per parameter, in parameter order
            if s_tilde > 0:
                return {
                    EPS + n: torch.randn(
                        params[n].shape, generator=gen, dtype=params[n].dtype, device=gen.device
                    ).to(u0[n].device)  # drawn on the CPU generator: the same on any device
                    for n in names
                }
            return {EPS + n: torch.zeros_like(params[n]) for n in names}

        def resample(
            v: int,
            loss: float,
            live: Mapping[str, Tensor],
            frozen: Mapping[str, Tensor],
            idx: Tensor,
        ) -> tuple[Params, Params] | None:  # stage one: Algorithm 1, lines 18-24
            losses.append(loss)
            if not is_check_point(v, cfg.tau):
                return None
            window = losses[v - 2 * cfg.tau + 1 : v + 1]
            now = track.beta
            if trend(window, cfg.tau) > 0:
                nxt = random_pattern(specs, cfg.p, gen, cfg.pattern_scope)
                track.resamples += 1
            else:
                nxt = now
            track.scores = {
                s.name: score_update(window, now[s.name], nxt[s.name], track.scores[s.name])
                for s in specs
            }
            track.beta = nxt
            return {}, masks_of(nxt)

        def finish(res: _jobs.JobResult) -> ClientResult:
            trained = {k: res.live[k].detach() for k in names}
            beta_end = track.beta
            sent = entry_masks(specs, beta_end, trained)
            local_params = {k: t * sent[k] if k in sent else t for k, t in trained.items()}
            kept_rows = sum(int(b.sum()) for b in beta_end.values())
            return ClientResult(
                uplink=encode_upload({k: trained[k] - down[k] for k in trained}, specs, beta_end),
                state=ClientState({k: v.detach() for k, v in track.scores.items()}),
                local_params=local_params,
                num_examples=data.num_examples,
                metrics={
                    "train/loss": res.loss,
                    "fedbiad/kept_fraction": kept_rows / max(1, sum(sp.count for sp in specs)),
                    "fedbiad/resamples": float(track.resamples),
                    "fedbiad/s2": s2,
                    "fedbiad/stage": 1.0 if stage_one else 2.0,
                },
            )

        frozen = {
            **masks_of(beta),
            S_TILDE: torch.tensor(s_tilde, dtype=u0[names[0]].dtype, device=u0[names[0]].device),
            KL_COEF: torch.tensor(kl_coef, dtype=u0[names[0]].dtype, device=u0[names[0]].device),
        }
        return _jobs.new_job(
            program_for(model, freeze),
            u0,
            data,
            ctx.local,
            batches,
            finish,
            frozen=frozen,
            draws=draws,
            after_step=resample if stage_one else None,
            hook_steps=frozenset(range(len(batches))) if stage_one else frozenset(),
        )

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        values, kept = [], []
        for u in uplinks:
            beta = {s.name: u.tensors[MASK + s.name].bool() for s in state.specs}
            update = decode_groups(u.tensors, state.params, state.specs, beta)  # 0 off the rows
            masks = (  # holders: + the next layer's columns reading dropped rows
                holder_masks(ctx.model, state.specs, beta, state.params)
                if cfg.next_columns == "holders"
                else entry_masks(state.specs, beta, state.params)
            )
            values.append(  # β_k ∘ U_k
                {
                    k: torch.where(masks[k], p + update[k], 0.0) if k in masks else p + update[k]
                    for k, p in state.params.items()
                }
            )
            kept.append(masks)
        weights = client_weights(uplinks, cfg.weighting)
        delta, held = aggregate(state.params, values, kept, weights, cfg.aggregation)
        step, opt_state = opt.update(delta, state.opt_state)
        step = {k: torch.where(held[k], s, 0.0) for k, s in step.items()}  # nobody kept: U_{r−1}
        return ServerState(apply_step(state.params, step), opt_state, state.specs)

    return FedAlgorithm(
        name=cfg.name,
        config=cfg,
        init_server=init_server,
        init_client=lambda client_id: ClientState(),
        broadcast=broadcast,
        client_update=_jobs.job_client_update(client_job),
        client_job=client_job,
        server_update=server_update,
        global_params=lambda s: s.params,
        uploaded_model=uploaded_model,
        validate_model=check_model,
    )


@register(Config)
def build(cfg: Config) -> FedAlgorithm:
    return make(cfg)
