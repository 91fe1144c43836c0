"""ProgFed: progressive training of a model split into S stages (specs/feddst-progfed.md §2).

Wang, Stich, He, Fritz, "ProgFed: Effective, Communication, and Computation Efficient Federated
Learning by Progressive Training", ICML 2022 (arXiv:2110.05323); official code
hui-po-wang/ProgFed.

Model (eq. 1-2): ``M = G_S ∘ E_S ∘ … ∘ E_1``, sub-model ``M^s = G_s ∘ E_s ∘ … ∘ E_1``. For
``s < S`` the temporary head ``G_s`` (global average pool + linear) is random when stage ``s``
starts and discarded when stage ``s + 1`` starts; ``G_S`` is the model's own classifier. The
stage split is the model's (:class:`fedcomm.models.progressive.ProgressiveNet`).

Schedule over ``T = train.rounds`` (the ``rounds`` field, resolved from it): ``T_s = ⌊T/(2S)⌋``
rounds for each ``s < S`` and the rest, ``T − (S−1)·T_s``, for the full model. Before every
stage ``s ≥ 2`` come ``warmup_rounds`` (W) **extra** rounds (not counted in T: the loop runs
``T + (S−1)·W`` rounds) that train only ``E_s`` and ``G_s`` with ``E_1..E_{s−1}`` frozen, at the
base learning rate, without advancing the schedule.

Round (spec §2(a)): the server sends the active sub-model ``M^s`` (its current head included);
each client runs local SGD (``train.local``: the paper's momentum 0.9, wd 1e-4) at the cosine
rate ``lr_t = max(η0·(1 + cos(π(t−1)/(T−1)))/2, min_lr)`` of the scheduled round ``t`` (not
reset at stage changes), skipping a step whose loss is ``≥ skip_loss`` (the code's guard), with
the optional proximal term ``μ‖θ − θ_server‖²`` (the code's form, no ½: gradient
``2μ(θ − θ_server)``); it uploads ``Δ = θ_client − θ_server`` of the parameters it trained. The
server averages the uploads (``weighting: uniform`` as the code, or by example counts) and
steps its optimizer (``server``: SGD lr 1 = FedAvg, or Adam = FedAdam). The server optimizer
is rebuilt whenever the trained set changes (each growth, and at the end of a warm-up); client
momentum is fresh every round (``client_momentum: reset``, the spec's recommendation) or kept
per client until the trained set changes (``persistent``, as the code's ``VirtualWorker.opt``).

Communication: down = the dense active sub-model ``M^s`` (``P_s`` values, head included); up =
the dense update of the trained parameters: ``M^s`` in a stage round, ``E_s + G_s`` in a warm-up
round. An uplink compressor (``lq``, ``sp``) applies to that update. ``stages: 1`` is the
end-to-end baseline with the same schedule, learning rate and aggregation.

Warm-up charge (``warmup_charge``, see :func:`charged_values`): ``sent`` (default, the spec's
recommendation) charges exactly what a warm-up round sends, ``P_s`` down and ``|E_s| + |G_s|``
up. ``code_counter`` charges what the official code's counter books (``main.py``: inside the
warm-up loop, ``cur_cost += |E_s| + |G_s|`` starts from the previous round's ``P_{s−1}`` and
accumulates over the W rounds, so warm-up round ``w = 1…W`` of stage ``s`` books
``c_w = P_{s−1} + w·(|E_s| + |G_s|)`` values per client), both ways: the message sent plus a
:class:`CounterCharge` entry of the difference, which carries nothing and is counted at 32 bits
per value (compressors pass it through uncompressed, so compare compressed runs as the paper
does: the float ratio times b/32 and p). That counter is where the paper's costs come from: with
the code's schedule it gives ProgFed's seven ResNet-18/CIFAR-100 costs of Table 12 to the GB
(S = 4, W = 25: 4,179 GB, 77.6% of dense end-to-end over T = 3000; Table 3 / 5 print 77.10%),
while ``sent`` gives 67.5% (66.6% without warm-up): the 25·26/2 = 325 copies of ``E_s + G_s``
it books per growth are not traffic, so ``sent`` stays the default.

Departures, documented: stage 1 lasts ``T_s`` rounds (the code's loop starts stage 2 one round
early); the code's CIFAR-10 ConvNet has a 16-way classifier (the paper's 10-way one is used);
the skip guard tests the data loss (the code tests the loss with the proximal term, which only
differs for a large ``mu``); the code's ``optim_init`` takes one zero-gradient server step each
time it builds the server optimizer (for FedAdam this shifts Adam's bias correction, making
the first real step about 0.74x as large), which is not replicated. ``local/accuracy`` averages
each client's last upload, so for ProgFed it mixes sub-models of earlier stages: compare runs
on global accuracy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import Field
from torch import Tensor, nn

from fedcomm.algorithms import _local
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
from fedcomm.algorithms.fedprox import proximal_hook
from fedcomm.comm import bits
from fedcomm.comm.codecs import encode_dense
from fedcomm.comm.payload import BitCount, Payload
from fedcomm.models.progressive import ProgressiveNet, is_staged
from fedcomm.seeding import Stream, torch_generator
from fedcomm.server_opt import OptState
from fedcomm.types import Params

WarmupCharge = Literal["sent", "code_counter"]
COUNTER = "progfed/code_counter"  # payload key of the CounterCharge entry


class Config(AlgorithmConfig):
    name: Literal["progfed"] = "progfed"
    stages: int = Field(
        2,
        ge=1,
        description="S: 3 for the EMNIST ConvNet and the cnn, 4 for the CIFAR-10 ConvNet and "
        "ResNet-18 (paper); 1 = the end-to-end baseline",
    )
    rounds: int | None = Field(
        None, ge=1, description="T, the scheduled rounds; null = train.rounds (resolved)"
    )
    warmup_rounds: int = Field(
        0, ge=0, description="W extra rounds per growth (paper: EMNIST 5, CIFAR-100 25)"
    )
    lr_schedule: Literal["cosine", "constant"] = Field(
        "cosine", description="client lr per scheduled round (the code: cosine)"
    )
    min_lr: float = Field(1e-6, ge=0, description="floor of the cosine schedule")
    weighting: Literal["uniform", "num_examples"] = Field(
        "uniform", description="server average (the code: unweighted)"
    )
    mu: float = Field(0.0, ge=0, description="proximal term μ‖θ−θ_s‖² (code's form; paper 0.1)")
    skip_loss: float | None = Field(
        10.0, gt=0, description="skip local steps whose loss is >= this (code: 10); null = off"
    )
    client_momentum: Literal["reset", "persistent"] = Field(
        "reset", description="client SGD momentum fresh each round, or kept per client"
    )
    grow_from: Literal["trained", "init"] = Field(
        "trained",
        description="trained (the paper): a stage starts from the previous stage's weights; "
        "init (ablation): every parameter returns to its initial value at each growth, so the "
        "last stage is end-to-end training over ProgFed's remaining rounds and lr schedule",
    )
    warmup_charge: WarmupCharge = Field(
        "sent",
        description="cost of a warm-up round: sent = M^s down, E_s + G_s up (what is sent); "
        "code_counter = the official code's accumulating counter, P_{s-1} + w·|E_s + G_s| "
        "both ways in warm-up round w (reproduces the paper's costs: 77.6% vs 67.5% for "
        "ResNet-18/CIFAR-100, W = 25)",
    )

    def with_rounds(self, rounds: int) -> Config:
        """This config with ``rounds = train.rounds`` if null; refuses a T too short for S, or a
        ``rounds`` that disagrees with ``train.rounds`` (the loop runs ``train.rounds`` plus the
        warm-up rounds, so the schedule must cover exactly that)."""
        if self.rounds is not None and self.rounds != rounds:
            raise ValueError(
                f"progfed: rounds={self.rounds} must equal train.rounds={rounds} (or be null); "
                "set the schedule's T through train.rounds"
            )
        if self.stages > 1 and rounds < 2 * self.stages:
            raise ValueError(
                f"progfed needs train.rounds >= 2*stages so each early stage gets "
                f"T/(2S) >= 1 round (got rounds={rounds}, stages={self.stages})"
            )
        return self.model_copy(update={"rounds": rounds})

    def extra_rounds(self) -> int:
        return (self.stages - 1) * self.warmup_rounds


@dataclass(frozen=True)
class Phase:
    """What one loop round does: the stage, whether it is a warm-up round, and the scheduled
    round ``t`` (1-based; warm-up rounds repeat the last scheduled round and use the base lr)."""

    stage: int
    warmup: bool
    t: int


def schedule(rounds: int, stages: int, warmup: int) -> list[Phase]:
    """The phase of every loop round (index ``r − 1``): ``rounds + (stages − 1)·warmup`` long."""
    ts = rounds // (2 * stages) if stages > 1 else rounds
    if ts < 1:
        raise ValueError(f"rounds={rounds} is too short for {stages} stages (T/(2S) < 1)")
    out: list[Phase] = []
    t = 0
    for s in range(1, stages + 1):
        if s > 1:
            out += [Phase(s, True, max(t, 1))] * warmup
        length = ts if s < stages else rounds - (stages - 1) * ts
        for _ in range(length):
            t += 1
            out.append(Phase(s, False, t))
    return out


def warmup_index(phases: Sequence[Phase]) -> list[int]:
    """For each loop round, its position ``w = 1…W`` within its stage's warm-up rounds (0 for a
    stage round)."""
    out: list[int] = []
    w = 0
    prev: Phase | None = None
    for ph in phases:
        w = w + 1 if prev is not None and prev.warmup and prev.stage == ph.stage else 1
        out.append(w if ph.warmup else 0)
        prev = ph
    return out


def charged_values(
    phases: Sequence[Phase],
    submodel: Sequence[int],
    new: Sequence[int],
    warmup_charge: WarmupCharge,
) -> list[tuple[int, int]]:
    """Values charged per client in each loop round, ``(down, up)``.

    Args:
        phases: the loop rounds (:func:`schedule`).
        submodel: ``P_1 … P_S``, the sub-models' sizes with their heads.
        new: ``|E_s| + |G_s|`` for ``s = 1 … S`` (what a warm-up round of stage ``s`` trains).
        warmup_charge: ``sent`` or ``code_counter`` (see the module docstring).

    Returns:
        ``(P_s, P_s)`` for a stage round; for warm-up round ``w`` of stage ``s``,
        ``(P_s, |E_s| + |G_s|)`` (``sent``) or ``(c_w, c_w)`` with
        ``c_w = P_{s−1} + w·(|E_s| + |G_s|)`` (``code_counter``).
    """
    out: list[tuple[int, int]] = []
    for ph, w in zip(phases, warmup_index(phases), strict=True):
        s = ph.stage
        if not ph.warmup:
            out.append((submodel[s - 1], submodel[s - 1]))
        elif warmup_charge == "sent":
            out.append((submodel[s - 1], new[s - 1]))
        else:
            c = submodel[s - 2] + w * new[s - 1]
            out.append((c, c))
    return out


@dataclass(frozen=True)
class CounterCharge:
    """``numel`` values the official code's warm-up counter books beyond what is sent: counted
    at 32 bits each (the code's 4 bytes), carrying nothing (decodes to an empty tensor)."""

    numel: int

    def decode(self) -> Tensor:
        return torch.zeros(0, device="cpu")

    def nbits(self) -> BitCount:
        return BitCount(payload=bits.dense(self.numel))

    def dense_bits(self) -> int:
        return bits.dense(self.numel)


def _with_counter(payload: Payload, numel: int) -> Payload:
    if numel <= 0:
        return payload
    return Payload({**payload.entries, COUNTER: CounterCharge(numel)})


def cosine_lr(base: float, t: int, rounds: int, floor: float) -> float:
    """The code's per-round client rate ``max(η0·(1 + cos(π(t−1)/(T−1)))/2, floor)``."""
    if rounds <= 1:
        return max(base, floor)
    return max(base * (1 + math.cos(math.pi * (t - 1) / (rounds - 1))) / 2, floor)


@dataclass(frozen=True)
class ServerState:
    params: Params  # every parameter of the progressive net (inactive ones at their init)
    opt_state: OptState  # over the parameters trained in the current phase
    submodels: tuple[tuple[str, ...], ...]  # parameter names of M^1 … M^S
    round_: int = 0  # rounds completed
    metrics: Mapping[str, float] = field(default_factory=dict)
    init: Params = field(default_factory=dict)  # the initial parameters (``grow_from: init``)


@dataclass(frozen=True)
class ClientState:
    key: tuple[int, bool]  # (stage, warmup) the momentum buffers belong to
    bufs: Params


def _net(model: nn.Module | None) -> ProgressiveNet:
    if not isinstance(model, ProgressiveNet):
        raise TypeError("progfed runs on the ProgressiveNet built by its prepare_model")
    return model


def _num_classes(model: nn.Module) -> int:
    """Output width of a staged model's classifier (its last 2-D weight)."""
    prefixes = getattr(model, "classifier_prefixes", ())
    weights = [
        p for n, p in model.named_parameters() if n.startswith(tuple(prefixes)) and p.ndim == 2
    ]
    if not weights:
        raise ValueError("progfed: the model's classifier has no 2-D weight")
    return int(weights[-1].shape[0])


@register(Config)
def build(cfg: Config) -> FedAlgorithm:
    opt = cfg.server.build()
    # T, resolved from train.rounds by with_rounds (Params.algorithm); a config built without
    # params (contract tests, direct library use) schedules T = 2S unless it sets rounds
    rounds = cfg.rounds if cfg.rounds is not None else 2 * cfg.stages
    phases = schedule(rounds, cfg.stages, cfg.warmup_rounds)
    prox = proximal_hook(2 * cfg.mu)  # the code's μ‖θ−θ_s‖² has gradient 2μ(θ−θ_s)

    windex = warmup_index(phases)

    def at(round_: int) -> int:
        return min(max(round_, 1), len(phases)) - 1

    def phase(round_: int) -> Phase:
        return phases[at(round_)]

    def active(net: ProgressiveNet, ph: Phase) -> list[str]:
        return net.submodel_params(ph.stage)

    def trained(net: ProgressiveNet, ph: Phase) -> list[str]:
        if ph.warmup:
            return [*net.block_params(ph.stage), *net.head_params(ph.stage)]
        return net.submodel_params(ph.stage)

    def counter_extra(net: ProgressiveNet, round_: int) -> tuple[int, int]:
        """``(down, up)`` values the code's counter books beyond the messages sent (0 unless
        ``warmup_charge: code_counter`` in a warm-up round)."""
        i = at(round_)
        ph = phases[i]
        if cfg.warmup_charge == "sent" or not ph.warmup:
            return 0, 0
        s = ph.stage
        numels = {n: p.numel() for n, p in net.named_parameters()}
        new = sum(numels[k] for k in trained(net, ph))
        booked = net.submodel_numel(s - 1) + windex[i] * new
        return booked - net.submodel_numel(s), booked - new

    def validate_model(model: nn.Module) -> None:
        if not is_staged(model):
            raise ValueError(
                f"progfed: model {type(model).__name__} has no stage split "
                "(staged models: mlp, cnn, mnist_cnn, resnet20, resnet18, progfed_emnist_cnn, "
                "progfed_cifar_cnn)"
            )
        try:
            model.stage_cuts(cfg.stages)  # type: ignore[operator]
        except ValueError as err:
            raise ValueError(f"progfed: stages={cfg.stages}: {err}") from None

    def prepare_model(model: nn.Module, seed: int) -> nn.Module:
        if isinstance(model, ProgressiveNet):
            return model
        validate_model(model)
        gen = torch_generator(seed, Stream.ALGORITHM, 0)  # the temporary heads' init
        return ProgressiveNet(model, cfg.stages, _num_classes(model), gen)

    def lr_factor(ph: Phase) -> float:
        """The round's client lr over the base lr (warm-up rounds: the base lr)."""
        if ph.warmup or cfg.lr_schedule == "constant":
            return 1.0
        return cosine_lr(1.0, ph.t, rounds, 0.0)

    def stats(net: ProgressiveNet, ph: Phase) -> dict[str, float]:
        """Logged per round (``progfed/...``): the phase, the active sub-model's size with its
        head, the trained parameters, the sub-model's fraction of the full model, lr / η0."""
        size = net.submodel_numel(ph.stage)
        numels = {n: p.numel() for n, p in net.named_parameters()}
        return {
            "stage": float(ph.stage),
            "warmup": float(ph.warmup),
            "scheduled_round": float(ph.t),
            "submodel_params": float(size),
            "trained_params": float(sum(numels[k] for k in trained(net, ph))),
            "submodel_fraction": size / net.dense_numel(),  # of the full model
            "lr_factor": lr_factor(ph),
        }

    def init_server(params: Params, ctx: RoundContext) -> ServerState:
        net = _net(ctx.model)
        ph = phase(1)
        sub = {k: params[k] for k in trained(net, ph)}
        subs = tuple(tuple(net.submodel_params(s)) for s in range(1, cfg.stages + 1))
        init = clone_params(params) if cfg.grow_from == "init" else {}
        return ServerState(clone_params(params), opt.init(sub), subs, 0, stats(net, ph), init)

    def broadcast(state: ServerState, cid: int, cstate: object, ctx: RoundContext) -> Payload:
        net = _net(ctx.model)
        down = encode_dense({k: state.params[k] for k in active(net, phase(ctx.round_))})
        return _with_counter(down, counter_extra(net, ctx.round_)[0])

    def client_update(
        down: Mapping[str, Tensor],
        cstate: ClientState | None,
        data: ClientData,
        ctx: ClientContext,
    ) -> ClientResult:
        net = _net(ctx.model)
        ph = phase(ctx.round_)
        keys = set(trained(net, ph))
        down = {k: v for k, v in down.items() if k != COUNTER}
        lr = ctx.local.lr
        if lr_factor(ph) != 1.0:
            lr = max(ctx.local.lr * lr_factor(ph), cfg.min_lr)
        local = ctx.local.model_copy(update={"lr": lr})
        bufs = None
        if cfg.client_momentum == "persistent" and cstate is not None:
            bufs = cstate.bufs if cstate.key == (ph.stage, ph.warmup) else None
        # dropout (EMNIST ConvNet) from the client's own replayable stream, not ctx.generator
        drop = torch_generator(ctx.seed, Stream.ALGORITHM, ctx.round_, ctx.client_id)
        dropout_seed = int(torch.randint(0, 2**62, (1,), generator=drop, device=drop.device))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(dropout_seed)
            res = _local.local_sgd(
                net.at_stage(ph.stage),
                down,
                data,
                local,
                ctx.generator,
                grad_hook=prox(down) if cfg.mu > 0 else None,
                trainable={k: k in keys for k in down},
                skip_loss=cfg.skip_loss,
                bufs=bufs,
            )
        delta = {k: res.params[k] - down[k] for k in down if k in keys}
        new_state = (
            ClientState((ph.stage, ph.warmup), res.bufs)
            if cfg.client_momentum == "persistent"
            else None
        )
        return ClientResult(
            uplink=_with_counter(encode_dense(delta), counter_extra(net, ctx.round_)[1]),
            state=new_state,
            local_params=res.params,
            num_examples=data.num_examples,
            metrics={"train/loss": res.loss, "progfed/client_lr": lr},
        )

    def server_update(
        state: ServerState, uplinks: Sequence[Uplink], ctx: RoundContext
    ) -> ServerState:
        net = _net(ctx.model)
        ph, nxt = phase(ctx.round_), phase(ctx.round_ + 1)
        keys = trained(net, ph)
        delta = weighted_mean(
            [u.tensors for u in uplinks], client_weights(uplinks, cfg.weighting), keys
        )
        step, opt_state = opt.update(delta, state.opt_state)
        params = dict(state.params)
        for k, s in step.items():
            params[k] = params[k] + s
        if nxt.stage != ph.stage and cfg.grow_from == "init":  # ablation: forget the stage
            params = clone_params(state.init)
        if (nxt.stage, nxt.warmup) != (ph.stage, ph.warmup):  # growth or end of warm-up
            opt_state = opt.init({k: params[k] for k in trained(net, nxt)})
        return ServerState(
            params, opt_state, state.submodels, ctx.round_, stats(net, ph), state.init
        )

    def global_params(state: ServerState) -> Params:
        # the sub-model of the last completed round (round 1's before training)
        names = state.submodels[phase(state.round_).stage - 1]
        return {k: state.params[k] for k in names}

    return FedAlgorithm(
        name=cfg.name,
        config=cfg,
        init_server=init_server,
        init_client=lambda cid: None,
        broadcast=broadcast,
        client_update=client_update,
        server_update=server_update,
        global_params=global_params,
        server_metrics=lambda s: s.metrics,
        uploaded_model=lambda down, up: {
            k: down[k] + up[k] if k in up else down[k] for k in down if k != COUNTER
        },
        validate_model=validate_model,
        prepare_model=prepare_model,
        unbatched=(
            "local steps run the stage's sub-network with dropout drawn from torch's global "
            "generator, reseeded per client (the EMNIST ConvNet's), and train a per-round "
            "subset at a per-round learning rate; a batched step cannot replay per-client "
            "global-generator draws"
        ),
    )
