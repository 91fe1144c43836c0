"""FedBIAD: Bayesian inference-based adaptive dropout of weight rows.

Xue et al., "FedBIAD: Communication-Efficient and Accuracy-Guaranteed Federated Learning with
Bayesian Inference-Based Adaptive Dropout", IPDPS 2023 (Sections III-IV, Algorithm 1, Eqs. 2-10,
13; setup and upload sizes: Section V, Table I); each module says what the paper leaves open.

This module is Algorithm 1; the details live beside the code that implements them:

* :mod:`.rows`: the droppable rows (``drop_output_layer``; ``lstm_rows``, with the paper's
  LM upload sizes computed for ``hh``/``both``), the keep counts ``ceil((1 − p)·rows_l)``
  (``pattern_scope``), the two stages' patterns, Eq. 8's trend and Eq. 9's scores, and stage
  one's check after each local step (lines 18-26, ``stage_one_check``);
* :mod:`.bayes`: the local objective, ``θ = β ∘ (U + s̃ε)`` with ``s̃²`` of Eq. 13 (its
  inputs read off the model) and the KL of Eqs. 2/5 (``kl``, ``kl_samples``, ``alpha``; why
  ``seen`` is the default: ``client`` costs 8 points on MNIST);
* :mod:`.server`: the upload and Eq. 10's three readings (``aggregation``: why ``masked``
  is the default and ``eq10`` as printed falls to 75.4% on MNIST), ``next_columns``.

Client ``k``, round ``r`` (persistent score vector ``E^k``, one float per row, from 0):

* forward pass ``θ = β ∘ (U + s̃ε)``, loss ``mean CE + KL/(α·m)``; dropped rows are zero and
  frozen (:mod:`.bayes`);
* stage one (``r ≤ R_b``): a random pattern ``β``; at iterations ``v = 2τ, 3τ, …`` the trend
  ``ΔL = mean(ℓ_{v−τ+1..v}) − mean(ℓ_{v−2τ+1..v−τ})`` (Eq. 8); ``ΔL > 0`` resamples ``β`` for the
  next ``τ`` iterations; the scores of the rows held at ``v`` are updated by Eq. 9 (only at these
  check points: ΔL exists only there);
* stage two (``r > R_b``): the top ``ceil((1 − p)·rows_l)`` rows of each layer by ``E`` (ties at
  random), fixed for the round;
* upload ``β^{k,V}`` (1 bit per row, all J rows) and the kept rows' values (32 bits each); the
  parameters in no droppable row densely.

Server: ``U_r = U_{r−1} + server_opt(Δ)`` with ``Δ`` from Eq. 10 read by ``aggregation``
(default ``masked``: per row, the ``|D_k|``-weighted mean over the clients that kept it). The
download is the dense ``U_{r−1}`` (32·N bits); the global model evaluated is ``θ = U_r``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import torch
from pydantic import Field, model_validator
from torch import Tensor, nn

from fedcomm import philox
from fedcomm.algorithms import core
from fedcomm.algorithms.core import AlgorithmConfig, FedAlgorithm
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core.context import (
    ClientContext,
    ClientData,
    ClientResult,
    RoundContext,
    Uplink,
)
from fedcomm.algorithms.core.grouped import entry_masks
from fedcomm.algorithms.fedbiad.bayes import (
    KL_COEF,
    S_TILDE,
    counter_noise,
    kept_scale,
    kl_weight,
    likelihood_terms,
    local_data_loss,
    local_program,
    model_variance,
    row_masks,
    weight_noise,
)
from fedcomm.algorithms.fedbiad.rows import (
    Track,
    initial_scores,
    random_pattern,
    row_specs,
    score_pattern,
    stage_one_check,
)
from fedcomm.algorithms.fedbiad.server import (
    aggregate,
    check_model,
    encode_upload,
    reconstruct,
    uploaded_model,
)
from fedcomm.comm.codecs import encode_dense
from fedcomm.comm.payload import Payload
from fedcomm.models.groups import GroupSpec
from fedcomm.seeding import Stream
from fedcomm.server_opt import OptState
from fedcomm.types import ParamDict


class Config(AlgorithmConfig):
    name: Literal["fedbiad"] = "fedbiad"
    p: float = Field(0.2, ge=0, lt=1, description="fraction of rows dropped")
    stage_boundary: int = Field(55, ge=0, description="R_b: rounds r ≤ R_b are stage one")
    tau: int = Field(3, ge=1, description="τ: iterations per loss-trend window")
    drop_output_layer: bool = True
    lstm_rows: Literal["hh", "ih", "both", "none"] = Field(
        "hh",
        description=(
            "droppable rows of recurrent (LSTM) layers: 'hh' only weight_hh_l* (+ bias_hh) "
            "rows, weight_ih always sent whole; 'ih' the reverse; 'both' every matrix; 'none' "
            "no recurrent row (an ablation). 'hh' reproduces the paper's LM upload at p = 0.5 "
            "(PTB 16.4 of 29.8 MB, 1.82x; 'both' gives 2.00x)"
        ),
    )
    drop_embedding: bool = Field(
        True,
        description="embedding dimensions droppable (default, part of the paper's 1.82x LM "
        "upload); false: the embedding sent whole (an ablation isolating the LM's dropped parts)",
    )
    loss_trend: Literal["batch", "data"] = Field(
        "batch",
        description="the losses of Eq. 8's trend: batch (default) = each local step's minibatch "
        "loss; data = L^k over the client's whole local data D^k after each step (the paper's "
        "notation; one extra forward pass over D^k per step, at the masked means β∘U)",
    )
    data_loss_chunk: int = Field(
        1024, ge=1, description="examples per forward pass of loss_trend: data"
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
    softmax_rows: Literal["zero", "kept"] = Field(
        "zero",
        description="the output layer's dropped rows in local training: zero (default: their "
        "logits are 0 and stay in the softmax) or kept (a reading: the softmax runs over the "
        "kept rows only, and a target whose row is dropped is left out of the step's mean); "
        "kept needs drop_output_layer",
    )
    rescale_rows: bool = Field(
        False,
        description="a reading: the kept rows scaled by rows / kept (inverted dropout, "
        "1/(1 − p)) in local training's forward pass and in the client's local model",
    )
    noise: Literal["generator", "counter"] = Field(
        "generator",
        description="where each step's weight noise ε is drawn: generator (default: the "
        "client's CPU generator, then copied to the device) or counter (Philox4x32 at (client "
        "key, step, parameter), computed on the device: no copy; other draws than generator's, "
        "the same words on every device, normals equal up to the device's last-bit rounding)",
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

    @model_validator(mode="after")
    def _softmax_needs_output_rows(self) -> Config:
        if self.softmax_rows == "kept" and not self.drop_output_layer:
            raise ValueError(
                "softmax_rows: kept needs drop_output_layer: true (with the output layer whole "
                "every row is kept, and the softmax is the plain one)"
            )
        return self


@dataclass(frozen=True)
class ClientState:
    """Per-client, kept across rounds: the score vector ``E`` as ``(rows_l,)`` float per layer
    (empty before the first participation: all zeros)."""

    scores: Mapping[str, Tensor] = field(default_factory=dict)


@dataclass(frozen=True)
class ServerState:
    params: ParamDict  # U
    opt_state: OptState
    specs: tuple[GroupSpec, ...]  # the droppable row layers


# --- the client: Algorithm 1, ClientUpdate ----------------------------------------------------


def first_pattern(
    cfg: Config,
    specs: Sequence[GroupSpec],
    scores: Mapping[str, Tensor],
    round_: int,
    generator: torch.Generator,
) -> dict[str, Tensor]:
    """Algorithm 1, lines 10-14: ``β^{k,0}``."""
    if round_ <= cfg.stage_boundary:  # stage one: drawn uniformly from Z
        return random_pattern(specs, cfg.p, generator, cfg.pattern_scope)
    return score_pattern(specs, scores, cfg.p, generator, cfg.pattern_scope)  # stage two: top E


def client_result(
    local_mask: Callable[[Tensor], Tensor],
    specs: Sequence[GroupSpec],
    down: Mapping[str, Tensor],
    data: ClientData,
    track: Track,
    metrics: Mapping[str, float],
    res: _jobs.JobResult,
) -> ClientResult:
    """Algorithm 1, line 28: upload ``β^{k,V}`` and the kept rows (as updates from ``down``);
    keep ``E`` for the next round."""
    trained = {k: res.live[k].detach() for k in down}
    beta_end = track.beta
    sent = entry_masks(specs, beta_end, trained)
    kept_rows = sum(int(b.sum()) for b in beta_end.values())
    return ClientResult(
        uplink=encode_upload({k: trained[k] - down[k] for k in trained}, specs, beta_end),
        state=ClientState({k: v.detach() for k, v in track.scores.items()}),
        local_params={k: t * local_mask(sent[k]) if k in sent else t for k, t in trained.items()},
        num_examples=data.num_examples,
        metrics={
            "train/loss": res.loss,
            "fedbiad/kept_fraction": kept_rows / max(1, sum(sp.count for sp in specs)),
            "fedbiad/resamples": float(track.resamples),
            **metrics,
        },
    )


def download(state: ServerState, client_id: int, cstate: ClientState, ctx: RoundContext) -> Payload:
    return encode_dense(state.params)  # U_{r−1}: 32·N


# --- the algorithm ---------------------------------------------------------------------------


def make(cfg: Config) -> FedAlgorithm[ServerState]:
    opt = cfg.server.build()
    programs: dict[tuple[int, bool], tuple[nn.Module, _jobs.LocalProgram]] = {}

    def init_server(params: ParamDict, ctx: RoundContext) -> ServerState:
        specs = row_specs(ctx.model, cfg.drop_output_layer, cfg.lstm_rows, cfg.drop_embedding)
        return ServerState(core.clone_params(params), opt.init(params), specs)

    def program_for(model: nn.Module, freeze: bool) -> _jobs.LocalProgram:  # one per structure
        hit = programs.get((id(model), freeze))
        if hit is None or hit[0] is not model:
            program = local_program(
                model,
                cfg.kl,
                freeze,
                rescale=cfg.rescale_rows,
                softmax_kept=cfg.softmax_rows == "kept",
            )
            hit = programs[(id(model), freeze)] = (model, program)
        return hit[1]

    def local_mask(sent: Tensor) -> Tensor:
        """A row mask as the client's local model applies it (scaled with ``rescale_rows``)."""
        mask = sent.to(torch.get_default_dtype())
        return mask * kept_scale(mask) if cfg.rescale_rows else mask

    def client_job(
        down: Mapping[str, Tensor], cstate: ClientState, data: ClientData, ctx: ClientContext
    ) -> _jobs.LocalJob:
        model, gen = ctx.model, ctx.generator
        specs = row_specs(model, cfg.drop_output_layer, cfg.lstm_rows, cfg.drop_embedding)
        params = dict(model.named_parameters())
        u0 = {k: down[k] for k in params}  # U^{k,0} = U_{r−1}
        scores = initial_scores(specs, cstate.scores)
        batches = _local.batch_schedule(data.num_examples, ctx.local, gen)
        s2 = model_variance(  # Eq. 13 (looked up here: benchmarks/ablations.py replaces it)
            model, cfg.p, cfg.B, int(data.x[0].numel()) if data.num_examples else 1,
            ctx.round_, len(batches), data.num_examples,
        )  # fmt: skip
        s_tilde, stage_one = math.sqrt(s2), ctx.round_ <= cfg.stage_boundary
        track = Track(first_pattern(cfg, specs, scores, ctx.round_, gen), scores)
        kl_coef = kl_weight(cfg, likelihood_terms(data.y), ctx.round_, len(batches))  # Eqs. 2/5
        freeze = ctx.local.momentum > 0 or ctx.local.weight_decay > 0
        ref = next(iter(u0.values()))
        frozen = {
            **row_masks(specs, track.beta, u0),
            S_TILDE: torch.tensor(s_tilde, dtype=ref.dtype, device=ref.device),
            KL_COEF: torch.tensor(kl_coef, dtype=ref.dtype, device=ref.device),
        }
        check = partial(
            stage_one_check, specs, cfg.p, cfg.tau, cfg.pattern_scope, gen, u0, track,
            data_loss=partial(local_data_loss, model, data, cfg.data_loss_chunk)
            if cfg.loss_trend == "data" else None,
        )  # fmt: skip
        metrics = {"fedbiad/s2": s2, "fedbiad/stage": 1.0 if stage_one else 2.0}
        key = philox.key_of(ctx.seed, Stream.NOISE, ctx.round_, ctx.client_id)  # noise: counter
        return _jobs.new_job(
            program_for(model, freeze),
            u0,
            data,
            ctx.local,
            batches,
            partial(client_result, local_mask, specs, u0, data, track, metrics),
            frozen=frozen,
            draws=partial(weight_noise, params, u0, s_tilde, gen)
            if cfg.noise == "generator"
            else counter_noise(params, u0, s_tilde, key),
            after_step=check if stage_one else None,  # lines 18-26 (Eqs. 8-9)
            hook_steps=frozenset(range(len(batches))) if stage_one else frozenset(),
        )

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:  # Algorithm 1, line 7
        holders = cfg.next_columns == "holders"
        weights = core.client_weights(uplinks, cfg.weighting)
        got = (reconstruct(u, state.params, state.specs, ctx.model, holders) for u in uplinks)
        delta, held = aggregate(state.params, got, weights, cfg.aggregation)  # Eq. 10, streamed
        # a row nobody kept stays U_{r−1}
        params, opt_state = opt.apply(state.params, delta, state.opt_state, held)
        return ServerState(params, opt_state, state.specs)

    return core.job_algorithm(
        cfg,
        init_server=init_server,
        broadcast=download,
        client_job=client_job,
        server_update=server_update,
        init_client=lambda client_id: ClientState(),
        uploaded_model=uploaded_model,
        validate_model=partial(check_model, cfg.next_columns),
        sparse_compute=True,  # each client trains the sub-model of its kept rows
    )


@core.register(Config)
def build(cfg: Config) -> FedAlgorithm[ServerState]:
    return make(cfg)
