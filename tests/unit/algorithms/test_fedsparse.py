"""FedSparse against the spec (specs/fedsparse-fedbiad.md §1.2-1.5, test list at the end)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from fedcomm.algorithms import build_algorithm, fedavg
from fedcomm.algorithms.core import RoundContext
from fedcomm.algorithms.core.grouped import decode_groups, encode_groups, entry_masks
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.algorithms.fedsparse import algorithm as fedsparse
from fedcomm.algorithms.fedsparse.gates import L0_SHIFT, gate_logits, hard_concrete
from fedcomm.algorithms.fedsparse.local import NOISE, input_gated, layer_of, step_noise
from fedcomm.algorithms.fedsparse.server import v_gradient, weight_gradient
from fedcomm.comm.codecs import build_compressor
from fedcomm.comm.payload import Payload
from fedcomm.data.datasets.registry import load_dataset
from fedcomm.data.federated import PartitionSpec, make_partition
from fedcomm.models import build_model, groups
from fedcomm.server_opt import ServerOptConfig
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors
from fedcomm.sparse_io import save_sparse


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    ds = load_dataset("digits")
    part = make_partition(ds, PartitionSpec("iid", 6, {}, 0.2, 0))
    return FederatedTensors.build(ds, part.train, part.test)


def _model(fed: FederatedTensors, hidden: int = 16) -> nn.Module:
    torch.manual_seed(0)
    return build_model(
        "mlp", input_shape=fed.input_shape, num_classes=fed.num_classes, hidden=[hidden]
    )


def _run(fed: FederatedTensors, cfg: object, rounds: int = 3, lr: float = 0.05) -> loop.RunResult:
    lc = loop.LoopConfig(
        rounds=rounds, clients_per_round=3, local=LocalConfig(batch_size=16, lr=lr), seed=1
    )
    alg = build_algorithm(cfg)  # type: ignore[arg-type]
    return loop.run(lc, alg, _model(fed), fed, build_compressor("none"), config_hash="t")


def test_hard_concrete_range_and_closed_form_probability() -> None:
    g = torch.Generator().manual_seed(0)
    for log_alpha in (-3.0, -1.0, 0.0, 2.0):
        u = torch.rand(200_000, generator=g).clamp(1e-6, 1 - 1e-6)
        z = hard_concrete(torch.full_like(u, log_alpha), u)
        assert float(z.min()) >= 0.0 and float(z.max()) <= 1.0
        expected = torch.sigmoid(torch.tensor(log_alpha + L0_SHIFT)).item()
        assert float((z > 0).float().mean()) == pytest.approx(expected, abs=5e-3)
    assert pytest.approx(1.599, abs=1e-3) == L0_SHIFT


def test_closed_form_v_gradient_equals_autograd() -> None:
    g = torch.Generator().manual_seed(1)
    T = 0.5  # unsaturated gates, so autograd's logs stay finite
    norms, v = torch.rand(7, generator=g) + 0.5, torch.randn(7, generator=g)
    zs = [torch.rand(7, generator=g) > 0.5 for _ in range(4)]
    v_leaf = v.clone().requires_grad_(True)
    theta = torch.sigmoid((norms - nn.functional.softplus(v_leaf)) / T)
    objective = torch.stack(
        [(z * theta.log() + (~z) * (1 - theta).log()).sum() for z in zs]
    ).mean()  # mean_s Σ_g z log θ + (1 − z) log(1 − θ), an ascent objective
    (auto,) = torch.autograd.grad(objective, v_leaf)
    closed = v_gradient(zs, theta.detach(), v, T)
    torch.testing.assert_close(closed, auto, rtol=1e-5, atol=1e-6)


def test_all_gates_on_reduces_to_fedavg_with_server_adam(fed: FederatedTensors) -> None:
    sparse = fedsparse.Config(lambda0=0.0, ce_scale=0.0, force_gates_on=True)
    avg = fedavg.Config(weighting="uniform", server=ServerOptConfig(optimizer="adam", lr=1e-3))
    a, b = _run(fed, sparse), _run(fed, avg)
    for k in a.final_params:
        torch.testing.assert_close(a.final_params[k], b.final_params[k], rtol=1e-5, atol=1e-7)
    acc = [r["global/accuracy"] for r in a.state.round_rows]
    assert acc == [r["global/accuracy"] for r in b.state.round_rows]
    # same content, but FedSparse also pays 1 bit per group each way and v downstream
    assert a.ledger.frame()["payload_bits"].sum() > b.ledger.frame()["payload_bits"].sum()


def test_pruned_groups_never_come_back(fed: FederatedTensors) -> None:
    import dataclasses

    cfg = fedsparse.Config(lambda0=2e-3, ce_scale=1e-4, gate_lr=0.05, gate_server_lr=0.1)
    alg = build_algorithm(cfg)
    history: list[fedsparse.ServerState] = []

    def recording(state, uplinks, ctx):  # type: ignore[no-untyped-def]
        new = alg.server_update(state, uplinks, ctx)
        history.append(new)
        return new

    lc = loop.LoopConfig(rounds=8, clients_per_round=3, local=LocalConfig(batch_size=16), seed=2)
    alg_rec = dataclasses.replace(alg, server_update=recording)
    loop.run(lc, alg_rec, _model(fed), fed, build_compressor("none"), config_hash="p")
    pruned_any = False
    for before, after in itertools.pairwise(history):
        for k in before.alive:
            assert not bool((after.alive[k] & ~before.alive[k]).any())  # nothing revives
            pruned_any |= bool((~after.alive[k]).any())
    assert pruned_any, "lambda0 this high must prune something within 8 rounds"
    for state in history:  # pruned groups are exactly zero, every round
        for spec in state.specs:
            dead = ~state.alive[spec.name]
            for name, axis in spec.members:
                assert torch.all(state.params[name].movedim(axis, 0)[dead] == 0)


def test_lambda0_from_round_delays_pruning(fed: FederatedTensors) -> None:
    """λ0 = 0 before ``lambda0_from_round``: until then the run is the λ0 = 0 run (which prunes
    only what the data closes). Switched on after the first rounds, the same λ0 that prunes ~98%
    from round 1 prunes nothing more (presumably because the gates' logits (‖w‖ − softplus v)/T
    have saturated; the MNIST profile's ``fedsparse_l0late`` shows the same at round 20)."""
    strong = {"lambda0": 2e-3, "ce_scale": 1e-4, "gate_lr": 0.05, "gate_server_lr": 0.1}

    def sparsity(cfg: fedsparse.Config) -> list[float]:
        return [r["model/sparsity"] for r in _run(fed, cfg, rounds=8).state.round_rows]

    now = sparsity(fedsparse.Config(**strong))
    assert sparsity(fedsparse.Config(**strong, lambda0_from_round=1)) == now
    off = sparsity(fedsparse.Config(**{**strong, "lambda0": 0.0}))
    assert now[-1] > off[-1] + 0.5
    assert sparsity(fedsparse.Config(**strong, lambda0_from_round=9)) == off  # never on
    assert sparsity(fedsparse.Config(**strong, lambda0_from_round=3)) == off  # on too late
    with pytest.raises(ValueError, match="lambda0_from_round"):
        fedsparse.Config(lambda0_from_round=0)


def test_counting_rule_on_a_hand_sized_model() -> None:
    # mlp 4 -> 3 -> 2. Groups: fc1 input features (4; weight 3x4), fc2 input features (3; weight
    # 2x3); biases ungated (3 + 2). Surviving: fc1 [1,1,0,1], fc2 [1,0,1].
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(4,), num_classes=2, hidden=[3])
    alg = build_algorithm(fedsparse.Config())
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    state = alg.init_server(params, RoundContext(0, torch.Generator(), 0, model))
    alive = {"fc1": torch.tensor([1, 1, 0, 1]).bool(), "fc2": torch.tensor([1, 0, 1]).bool()}
    state = fedsparse.ServerState(
        state.params, state.v, alive, state.w_opt, state.v_opt, state.specs
    )
    down = alg.broadcast(state, 0, None, RoundContext(1, torch.Generator(), 0, model)).nbits()
    # down: 32 x surviving params (fc1.w 3x3 + fc1.b 3 + fc2.w 2x2 + fc2.b 2 = 18)
    #       + 32 x surviving groups (v: 3 + 2) + 1 bit per group (4 + 3)  = 576 + 160 + 7
    assert (down.payload, down.index, down.meta) == (576 + 160 + 7, 0, 0)
    # up: z over surviving groups, fc1 -> [1,0,_,1], fc2 -> [1,_,0]: 1 bit per surviving group (5)
    #     + 32 x (fc1.w 3x2 + fc2.w 2x1 + biases 3 + 2 = 13)                 = 5 + 416
    z = {"fc1": torch.tensor([1, 0, 0, 1]).bool(), "fc2": torch.tensor([1, 0, 0]).bool()}
    specs = list(groups(model))
    up = Payload(encode_groups(params, specs, z, send_masks=True, mask_over=alive)).nbits()
    assert up.total == 5 + 416


def test_metrics_and_sparse_model_file(fed: FederatedTensors, tmp_path: object) -> None:
    from pathlib import Path

    cfg = fedsparse.Config(lambda0=3e-3, gate_lr=0.05, gate_server_lr=0.1)
    res = _run(fed, cfg, rounds=10, lr=0.1)
    last = res.state.round_rows[-1]
    for key in (
        "fedsparse/tv_mean",
        "fedsparse/tv_max",
        "fedsparse/groups_alive",
        "model/sparsity",
    ):
        assert key in last
    assert 0.0 <= last["fedsparse/tv_mean"] <= last["fedsparse/tv_max"] <= 1.0
    sparsity = last["model/sparsity"]
    assert sparsity > 0.2
    out = Path(str(tmp_path))
    save_sparse(res.final_params, out / "sparse.safetensors")
    save_sparse({k: v + 1.0 for k, v in res.final_params.items()}, out / "dense.safetensors")
    ratio = (out / "sparse.safetensors").stat().st_size / (out / "dense.safetensors").stat().st_size
    assert ratio < 1 - 0.5 * sparsity  # smaller by roughly the sparsity (plus index overhead)
    assert math.isfinite(last["global/accuracy"])


def _hand_model() -> tuple[nn.Module, object, fedsparse.ServerState]:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(4,), num_classes=2, hidden=[3])
    alg = build_algorithm(fedsparse.Config(force_gates_on=False))
    params = {k: p.detach().clone() + 0.5 for k, p in model.named_parameters()}
    return model, alg, alg.init_server(params, RoundContext(0, torch.Generator(), 0, model))


def test_initial_theta_and_server_gate_direction() -> None:
    from fedcomm.algorithms.core import Uplink

    model, alg, state = _hand_model()
    theta = {
        s.name: torch.sigmoid(gate_logits(state.params, state.v, s, 1e-3)) for s in state.specs
    }
    for t in theta.values():
        torch.testing.assert_close(t, torch.full_like(t, 0.99), rtol=0, atol=1e-3)
    ctx = RoundContext(1, torch.Generator(), 0, model)
    for z_on, direction in ((True, 1.0), (False, -1.0)):
        z = {s.name: torch.full((s.count,), z_on) for s in state.specs}
        up = Payload(encode_groups(state.params, list(state.specs), z, send_masks=True)).decode()
        new = alg.server_update(state, [Uplink(0, 5, up), Uplink(1, 5, up)], ctx)
        for s in state.specs:  # z = 1 everywhere raises θ (v goes down); z = 0 lowers it
            assert torch.all(direction * (state.v[s.name] - new.v[s.name]) > 0)


def test_client_upload_is_counted_and_is_z_times_w(fed: FederatedTensors) -> None:
    from fedcomm.algorithms.core import ClientContext

    model = _model(fed, hidden=8)
    alg = build_algorithm(fedsparse.Config())
    params = {k: p.detach().clone() for k, p in model.named_parameters()}
    state = alg.init_server(params, RoundContext(0, torch.Generator(), 0, model))
    down = alg.broadcast(state, 0, None, RoundContext(1, torch.Generator(), 0, model))
    ctx = ClientContext(
        1, 0, model, LocalConfig(batch_size=16), torch.Generator().manual_seed(3), 0
    )
    res = alg.client_update(down.decode(), None, fed.train[0], ctx)
    up = res.uplink
    n_groups = sum(s.count for s in state.specs)
    assert not any(k.startswith("v/") for k in up)  # clients never upload v
    assert sum(int(up[f"mask/{s.name}"].decode().numel()) for s in state.specs) == n_groups
    kept_values = sum(up[k].decode().numel() for k in up if k.startswith("w/"))
    assert up.nbits().total == n_groups + 32 * kept_values
    nonzero = sum(int(torch.count_nonzero(t)) for t in res.local_params.values())
    assert nonzero <= kept_values  # ŵ_s = z_s ⊙ w_s: exactly what was sent (zeros aside)
    for s in state.specs:  # every dropped group of the upload is zero in the local model
        z = up[f"mask/{s.name}"].decode().bool()
        for name, axis in s.members:
            assert torch.all(res.local_params[name].movedim(axis, 0)[~z] == 0)


def test_step_noise_in_one_draw_equals_the_per_step_draws() -> None:
    """The local steps' gate noise, drawn at once, is what drawing it step by step, group by
    group, would give (the same generator stream: torch's CPU uniform fills element by element)."""
    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10)
    specs = [s for s in groups(model)]
    params = dict(model.named_parameters())
    g = torch.Generator().manual_seed(7)
    torch.randperm(50, generator=g)  # whatever the client drew before
    at_once = step_noise(specs, 5, g, params)
    after = torch.rand(3, generator=g)
    g = torch.Generator().manual_seed(7)
    torch.randperm(50, generator=g)
    for step in at_once:
        for s in specs:
            expected = torch.rand(s.count, generator=g).clamp(1e-6, 1 - 1e-6)
            assert torch.equal(step[NOISE + s.name], expected)
    assert torch.equal(torch.rand(3, generator=g), after)  # the stream continues as before
    assert step_noise(specs, 0, g, params) == []


def test_input_gating_is_chosen_where_the_input_is_smaller_than_the_weight() -> None:
    model = build_model("mlp", input_shape=(1, 28, 28), num_classes=10, hidden=[128])
    fc1, fc2 = groups(model)  # input features of fc1 (784 -> 128) and fc2 (128 -> 10)
    assert layer_of(fc1) == "fc1"
    assert input_gated(model, fc1, rows=10)  # 10 x 784 input < 128 x 784 weight
    assert not input_gated(model, fc1, rows=128)
    assert not input_gated(model, fc2, rows=10)  # 10 outputs: no cheaper
    cnn = build_model("cnn", input_shape=(1, 28, 28), num_classes=10)
    conv1 = next(s for s in groups(cnn) if s.name == "conv1")
    assert not input_gated(cnn, conv1, rows=1)  # filters: gated on the weight


@pytest.mark.parametrize("backend", ["sequential", "vectorized"])
def test_gates_on_the_input_train_as_gates_on_the_weight(
    fed: FederatedTensors, backend: str
) -> None:
    """``gate_at: auto`` (x ⊙ z into fc1) against ``weights`` (W ⊙ z), from the same seed: the
    same function, so the same bits and, to float rounding, the same model and metrics."""

    def run(gate_at: str) -> loop.RunResult:
        lc = loop.LoopConfig(
            rounds=3,
            clients_per_round=3,
            local=LocalConfig(batch_size=8, lr=0.05),
            seed=1,
            backend=backend,
        )
        alg = build_algorithm(fedsparse.Config(gate_at=gate_at, lambda0=1e-3))
        return loop.run(lc, alg, _model(fed, 32), fed, build_compressor("none"), config_hash="t")

    auto, weights = run("auto"), run("weights")
    assert auto.ledger.rows == weights.ledger.rows
    for k in auto.final_params:
        torch.testing.assert_close(
            auto.final_params[k], weights.final_params[k], rtol=1e-5, atol=1e-6
        )
    for a, b in zip(auto.state.round_rows, weights.state.round_rows, strict=True):
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5)


def test_input_gates_reach_the_layer_input_only_during_the_step(fed: FederatedTensors) -> None:
    """The gated program hooks fc1's input for the forward pass and leaves no hook behind."""
    model = _model(fed, 32)
    alg = build_algorithm(fedsparse.Config())
    lc = loop.LoopConfig(
        rounds=1, clients_per_round=2, local=LocalConfig(batch_size=8, lr=0.05), seed=1
    )
    loop.run(lc, alg, model, fed, build_compressor("none"), config_hash="t")
    assert not model.fc1._forward_pre_hooks  # type: ignore[union-attr]


def test_server_weight_gradient_equals_the_per_client_form() -> None:
    """Each upload added into its kept slices against Algorithm 1's per-client full-size
    ``p_s z_s ⊙ (ŵ_s − w)``, with dropped and pruned groups and ungated biases: bit-equal."""
    model = build_model("cnn", input_shape=(1, 28, 28), num_classes=10)
    specs = list(groups(model))
    g = torch.Generator().manual_seed(2)
    params = {k: torch.randn(p.shape, generator=g) for k, p in model.named_parameters()}
    alive = {s.name: torch.rand(s.count, generator=g) < 0.9 for s in specs}
    uploads, zs = [], []
    for _ in range(4):
        z = {s.name: (torch.rand(s.count, generator=g) < 0.6) & alive[s.name] for s in specs}
        local = {k: torch.randn(t.shape, generator=g) for k, t in params.items()}
        up = Payload(encode_groups(local, specs, z, send_masks=True, mask_over=alive)).decode()
        uploads.append(up)
        zs.append(z)
    weights = torch.tensor([0.1, 0.4, 0.3, 0.2])
    fast = weight_gradient(params, uploads, zs, weights, specs)
    reference = _weight_gradient_per_client(params, uploads, zs, weights, specs)
    for k in reference:
        assert torch.equal(fast[k], reference[k]), k  # the same products and sums, in order


def _weight_gradient_per_client(
    params: dict[str, torch.Tensor],
    uploads: list[dict[str, torch.Tensor]],
    zs: list[dict[str, torch.Tensor]],
    weights: torch.Tensor,
    specs: list,
) -> dict[str, torch.Tensor]:
    """``fedsparse.weight_gradient`` as Algorithm 1 writes it: per client, over full-size decoded
    uploads, ``p_s z_s ⊙ (ŵ_s − w)``."""
    g_w = {k: torch.zeros_like(t) for k, t in params.items()}
    for up, z, wt in zip(uploads, zs, weights, strict=True):
        w_hat = decode_groups(up, params, specs, z)
        kept = entry_masks(specs, z, params)
        for k in g_w:  # ungated parameters are always sent
            g_w[k] += wt * (w_hat[k] - params[k]) * kept.get(k, 1.0)
    return g_w
