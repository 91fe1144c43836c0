"""ProgFed (specs/feddst-progfed.md §2): schedule, growth and warm-up, counting, reductions."""

from __future__ import annotations

import math

import polars as pl
import pytest
import torch
from tests.conftest import digits_federation, tiny_cnn, tiny_params

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.progfed import Config
from fedcomm.algorithms.progfed.schedule import Phase, cosine_lr, schedule
from fedcomm.comm.codecs import build_compressor
from fedcomm.config import ConfigError, Params
from fedcomm.models import build_model
from fedcomm.models.progressive import ProgressiveNet
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _run(
    fed: FederatedTensors, rounds: int, compressor: str = "none", **kw: object
) -> loop.RunResult:
    cfg = Config(**kw).with_rounds(rounds)  # type: ignore[arg-type]
    alg = build_algorithm(cfg)
    lcfg = loop.LoopConfig(
        rounds=rounds + cfg.extra_rounds(),
        clients_per_round=3,
        local=LocalConfig(epochs=1, batch_size=16, lr=0.05),
        seed=3,
        checkpoint_every=100,
    )
    return loop.run(lcfg, alg, tiny_cnn(fed), fed, build_compressor(compressor), config_hash="pf")


def test_schedule_gives_early_stages_t_over_2s_and_extra_warmup_rounds() -> None:
    phases = schedule(12, 3, 2)
    assert len(phases) == 12 + 2 * 2
    assert phases[:2] == [Phase(1, False, 1), Phase(1, False, 2)]
    assert phases[2:4] == [Phase(2, True, 2)] * 2  # warm-up: schedule does not advance
    assert phases[4:6] == [Phase(2, False, 3), Phase(2, False, 4)]
    assert phases[6:8] == [Phase(3, True, 4)] * 2
    assert [p.t for p in phases[8:]] == list(range(5, 13))  # full model: T(S+1)/(2S) = 8
    assert all(p.stage == 3 and not p.warmup for p in phases[8:])
    assert schedule(10, 1, 5) == [Phase(1, False, t) for t in range(1, 11)]


def test_cosine_lr_is_the_codes_per_round_rule() -> None:
    assert cosine_lr(0.1, 1, 11, 1e-6) == pytest.approx(0.1)
    assert cosine_lr(0.1, 6, 11, 1e-6) == pytest.approx(0.05)
    assert cosine_lr(0.1, 11, 11, 1e-6) == pytest.approx(1e-6)  # floored at the last round
    assert cosine_lr(0.1, 3, 11, 0.0) == pytest.approx(0.1 * (1 + math.cos(math.pi * 0.2)) / 2)


def test_resnet18_cost_ratio_with_s4_is_two_thirds_without_warmup() -> None:
    """Spec §2(c)/(v): ResNet-18 (C = 100), S = 4, T = 3000: Σ_s T_s·P_s / (T·P_S) = 66.6%."""
    torch.manual_seed(0)
    base = build_model("resnet18", input_shape=(3, 32, 32), num_classes=100)
    net = ProgressiveNet(base, 4, 100, torch.Generator().manual_seed(0))
    sizes = [net.submodel_numel(s) for s in range(1, 5)]
    assert sizes == [156_324, 688_292, 2_800_804, 11_220_132]
    phases = schedule(3000, 4, 0)
    cost = sum(sizes[p.stage - 1] for p in phases)
    assert cost / (3000 * sizes[-1]) == pytest.approx(0.666, abs=5e-4)


def test_ledger_counts_the_active_submodel_both_ways_and_warmup_uploads_new_block(
    fed: FederatedTensors,
) -> None:
    res = _run(fed, rounds=6, stages=3, warmup_rounds=1)  # T_s = 1: 1, W, 1, W, 4 rounds
    net = ProgressiveNet(tiny_cnn(fed), 3, fed.num_classes, torch.Generator().manual_seed(0))
    numel = {n: p.numel() for n, p in net.named_parameters()}
    phases = schedule(6, 3, 1)
    ledger = res.ledger.frame()
    for r, ph in enumerate(phases, 1):
        rows = ledger.filter(pl.col("round") == r)
        down = rows.filter(pl.col("direction") == "down")["payload_bits"].to_list()
        up = rows.filter(pl.col("direction") == "up")["payload_bits"].to_list()
        sub = net.submodel_numel(ph.stage)
        new = sum(numel[k] for k in [*net.block_params(ph.stage), *net.head_params(ph.stage)])
        assert down == [32 * sub] * 3, r
        assert up == [32 * (new if ph.warmup else sub)] * 3, r
    stages = [row["progfed/stage"] for row in res.state.round_rows]
    assert stages == [p.stage for p in phases]
    assert [row["progfed/warmup"] for row in res.state.round_rows] == [
        float(p.warmup) for p in phases
    ]


def test_growth_copies_trained_blocks_and_warmup_freezes_them(fed: FederatedTensors) -> None:
    rounds = 6
    cfg = Config(stages=3, warmup_rounds=1).with_rounds(rounds)
    alg = build_algorithm(cfg)
    net = alg.prepare_model(tiny_cnn(fed), 3) if alg.prepare_model else None
    assert isinstance(net, ProgressiveNet)
    init = {k: v.detach().clone() for k, v in net.named_parameters()}
    lcfg = loop.LoopConfig(
        rounds=1, clients_per_round=3, local=LocalConfig(lr=0.05), seed=3, checkpoint_every=100
    )
    after1 = loop.run(lcfg, alg, tiny_cnn(fed), fed, build_compressor("none"), config_hash="g")
    lcfg2 = loop.LoopConfig(
        rounds=2, clients_per_round=3, local=LocalConfig(lr=0.05), seed=3, checkpoint_every=100
    )
    after2 = loop.run(lcfg2, alg, tiny_cnn(fed), fed, build_compressor("none"), config_hash="g")
    s1, s2 = after1.state.server.params, after2.state.server.params
    e1 = net.block_params(1)
    e2 = [*net.block_params(2), *net.head_params(2)]
    # stage 1 trained E1 and its head; E2 and G2 are still at construction time
    assert not all(torch.equal(s1[k], init[k]) for k in e1)
    assert all(torch.equal(s1[k], init[k]) for k in e2)
    # the warm-up round (round 2) keeps the trained E1 (copied, frozen) and trains E2 + G2
    assert all(torch.equal(s2[k], s1[k]) for k in e1)
    assert all(not torch.equal(s2[k], init[k]) for k in e2 if k.endswith("weight"))
    # the model evaluated after the warm-up is M^2: E1, E2 and G2, without G1
    g = alg.global_params(after2.state.server)
    assert sorted(g) == sorted(net.submodel_params(2))
    assert not any(k.startswith("heads.0.") for k in g)
    # at the end of training the global model is the base model, temporary heads discarded
    final = _run(fed, rounds=6, stages=3, warmup_rounds=1).final_params
    assert sorted(final) == sorted(n for n, _ in tiny_cnn(fed).named_parameters())


@pytest.mark.parametrize("grow_from", ["trained", "init"])
def test_grow_from_init_forgets_the_early_stages(fed: FederatedTensors, grow_from: str) -> None:
    # T = 6, S = 3: stage 1 is round 1, stage 2 round 2, stage 3 rounds 3-6. After round 2 the
    # net grows to the full model: from the trained blocks (the paper) or, as the ablation
    # `grow_from: init`, from the initial parameters, every one of them
    cfg = Config(stages=3, grow_from=grow_from).with_rounds(6)  # type: ignore[arg-type]
    alg = build_algorithm(cfg)
    net = alg.prepare_model(tiny_cnn(fed), 3) if alg.prepare_model else None
    assert isinstance(net, ProgressiveNet)
    init = {k: v.detach().clone() for k, v in net.named_parameters()}

    def server_after(rounds: int) -> dict[str, torch.Tensor]:
        lcfg = loop.LoopConfig(
            rounds=rounds, clients_per_round=3, local=LocalConfig(lr=0.05), seed=3
        )
        res = loop.run(lcfg, alg, tiny_cnn(fed), fed, build_compressor("none"), config_hash="gi")
        return dict(res.state.server.params)

    at_growth, trained = server_after(2), server_after(3)
    reset = all(torch.equal(at_growth[k], init[k]) for k in init)
    assert reset == (grow_from == "init")
    assert not all(torch.equal(trained[k], init[k]) for k in init)  # stage 3 trains either way


def test_one_stage_with_fedavg_settings_is_fedavg(fed: FederatedTensors) -> None:
    """``stages: 1`` with a constant lr, example weighting and no guard is plain FedAvg."""
    a = _run(fed, 3, stages=1, lr_schedule="constant", weighting="num_examples", skip_loss=None)
    fedavg = build_algorithm(CONFIGS["fedavg"]())
    lcfg = loop.LoopConfig(
        rounds=3,
        clients_per_round=3,
        local=LocalConfig(epochs=1, batch_size=16, lr=0.05),
        seed=3,
        checkpoint_every=100,
    )
    b = loop.run(lcfg, fedavg, tiny_cnn(fed), fed, build_compressor("none"), config_hash="pf")
    for k in b.final_params:
        assert torch.allclose(a.final_params[k], b.final_params[k], atol=1e-6), k
    accs_a = [r["global/accuracy"] for r in a.state.round_rows]
    accs_b = [r["global/accuracy"] for r in b.state.round_rows]
    assert accs_a == pytest.approx(accs_b)


def test_proximal_gradient_is_two_mu_times_the_drift(fed: FederatedTensors) -> None:
    """The code's μ‖θ − θ_s‖² (no ½): with a tiny lr the client's update is −lr·(g + 2μ(θ−θ_s))
    summed over steps; one step from θ_s has no drift, so compare against an explicit hook."""
    from fedcomm.algorithms.core import ClientContext
    from fedcomm.algorithms.core import local as _local

    alg = build_algorithm(Config(stages=1, mu=0.5, skip_loss=None).with_rounds(4))
    net = alg.prepare_model(tiny_cnn(fed), 0) if alg.prepare_model else None
    assert isinstance(net, ProgressiveNet)
    params = {k: v.detach().clone() for k, v in net.named_parameters()}
    local = LocalConfig(epochs=1, batch_size=16, lr=0.05)
    ctx = ClientContext(1, 0, net, local, torch.Generator().manual_seed(5), seed=3)
    got = alg.client_update(params, None, fed.train[0], ctx).local_params
    hook = {k: v for k, v in params.items()}

    def two_mu(p, grads):  # type: ignore[no-untyped-def]
        return {k: g + 2 * 0.5 * (p[k].detach() - hook[k]) for k, g in grads.items()}

    want = _local.local_sgd(
        net, params, fed.train[0], local, torch.Generator().manual_seed(5), grad_hook=two_mu
    ).params
    for k in want:
        torch.testing.assert_close(got[k], want[k])


def test_persistent_client_momentum_is_kept_per_phase(fed: FederatedTensors) -> None:
    def run(mode: str) -> loop.RunResult:
        cfg = Config(stages=2, warmup_rounds=1, client_momentum=mode).with_rounds(8)  # type: ignore[arg-type]
        lcfg = loop.LoopConfig(
            rounds=8 + cfg.extra_rounds(),
            clients_per_round=5,
            local=LocalConfig(epochs=1, batch_size=16, lr=0.05, momentum=0.9),
            seed=3,
            checkpoint_every=100,
        )
        comp = build_compressor("none")
        return loop.run(lcfg, build_algorithm(cfg), tiny_cnn(fed), fed, comp, config_hash="m")

    reset, kept = run("reset"), run("persistent")
    assert all(rec.state is None for rec in reset.state.clients.values())
    states = [rec.state for rec in kept.state.clients.values()]
    assert states and all(s is not None and s.bufs for s in states)
    assert {s.key for s in states} <= {(1, False), (2, True), (2, False)}
    assert not torch.equal(reset.final_params["fc1.weight"], kept.final_params["fc1.weight"])


def test_client_lr_follows_the_cosine_schedule_and_warmup_uses_the_base_lr(
    fed: FederatedTensors,
) -> None:
    res = _run(fed, 8, stages=2, warmup_rounds=1)
    phases = schedule(8, 2, 1)
    got = [row["progfed/client_lr"] for row in res.state.round_rows]
    want = [0.05 if p.warmup else cosine_lr(0.05, p.t, 8, 1e-6) for p in phases]
    assert got == pytest.approx(want)
    assert phases[2].warmup and got[2] == pytest.approx(0.05)  # warm-up: the base lr
    assert got[3] < got[1] < 0.05  # then the schedule resumes where it was (no restart)


def test_fedadam_server_runs_across_stage_changes(fed: FederatedTensors) -> None:
    res = _run(fed, 8, stages=3, warmup_rounds=1, server={"optimizer": "adam", "lr": 0.01})
    assert [r["progfed/stage"] for r in res.state.round_rows] == [
        float(p.stage) for p in schedule(8, 3, 1)
    ]
    assert all(math.isfinite(r["global/accuracy"]) for r in res.state.round_rows)
    sgd = _run(fed, 8, stages=3, warmup_rounds=1)
    assert not torch.equal(res.final_params["fc2.weight"], sgd.final_params["fc2.weight"])


def test_lq_uplink_composes_with_progfed(fed: FederatedTensors) -> None:
    res = _run(fed, 4, compressor="lq", stages=2)
    up = res.ledger.frame().filter(pl.col("direction") == "up")
    down = res.ledger.frame().filter(pl.col("direction") == "down")
    # 8 bits per value up (plus per-tensor metadata), 32 down
    ratio = up["payload_bits"].sum() / down["payload_bits"].sum()
    assert ratio == pytest.approx(0.25)
    assert all(math.isfinite(r["global/accuracy"]) for r in res.state.round_rows)


def test_bad_params_are_refused_by_name() -> None:
    raw = tiny_params(**{"train.rounds": 5, "experiment.runs": ["pf"]})
    raw["algorithms"] = {"pf": {"name": "progfed", "stages": 3}}
    params = Params.model_validate(raw)
    with pytest.raises(ConfigError, match=r"algorithms\.pf: .*rounds=5, stages=3"):
        params.algorithm("pf")
    raw["algorithms"] = {"pf": {"name": "progfed", "stages": 2, "rounds": 4}}
    with pytest.raises(ConfigError, match=r"rounds=4 must equal train.rounds=5"):
        Params.model_validate(raw).algorithm("pf")
    alg = build_algorithm(Config(stages=3).with_rounds(10))
    lstm = build_model("lstm", input_shape=(5,), num_classes=7, embed_dim=4, hidden=4)
    assert alg.validate_model is not None
    with pytest.raises(ValueError, match="no stage split"):
        alg.validate_model(lstm)
    mlp = build_model("mlp", input_shape=(4,), num_classes=3, hidden=[5])
    with pytest.raises(ValueError, match="stages=3"):
        alg.validate_model(mlp)  # one hidden layer: at most 2 stages


def test_resume_in_the_middle_of_a_warmup_equals_an_uninterrupted_run(
    fed: FederatedTensors, tmp_path: pytest.TempPathFactory
) -> None:
    from pathlib import Path

    cfg = Config(stages=3, warmup_rounds=2, client_momentum="persistent").with_rounds(6)
    total = 6 + cfg.extra_rounds()  # phases: 1, W, W, 2, W, W, 3 x 4

    def lcfg(rounds: int) -> loop.LoopConfig:
        local = LocalConfig(epochs=1, batch_size=16, lr=0.05, momentum=0.9)
        return loop.LoopConfig(rounds, 3, local, seed=3, checkpoint_every=1)

    ckpt = Path(str(tmp_path)) / "state.pt"
    comp = build_compressor("lq", bits=4)
    loop.run(
        lcfg(3),
        build_algorithm(cfg),
        tiny_cnn(fed),
        fed,
        comp,
        config_hash="r",
        checkpoint_path=ckpt,
    )  # checkpoints after rounds 1 and 2 (mid warm-up)
    resumed = loop.run(
        lcfg(total),
        build_algorithm(cfg),
        tiny_cnn(fed),
        fed,
        comp,
        config_hash="r",
        checkpoint_path=ckpt,
    )
    assert resumed.resumed_from == 2
    whole = loop.run(lcfg(total), build_algorithm(cfg), tiny_cnn(fed), fed, comp, config_hash="r")
    for k in whole.final_params:
        assert torch.equal(resumed.final_params[k], whole.final_params[k]), k
    assert resumed.ledger.rows == whole.ledger.rows
