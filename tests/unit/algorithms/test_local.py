"""The one local loop: equal to torch.optim.SGD over the same batches; hooks; config rules."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
import torch
import torch.nn.functional as F
from pydantic import ValidationError
from torch import Tensor, nn

from fedcomm.algorithms.core import ClientData
from fedcomm.algorithms.core.local import LocalConfig, batch_schedule, local_sgd, make_step

N, D, C = 23, 5, 3  # examples, features, classes: 23 = 2 full batches of 8 and one of 7


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, C))


def _data() -> ClientData:
    g = torch.Generator().manual_seed(1)
    return ClientData(torch.randn(N, D, generator=g), torch.randint(0, C, (N,), generator=g))


def _params(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _gen(seed: int = 7) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _clone(g: torch.Generator) -> torch.Generator:
    c = torch.Generator()
    c.set_state(g.get_state())
    return c


def _reference(
    model: nn.Module,
    params: Mapping[str, Tensor],
    data: ClientData,
    cfg: LocalConfig,
    generator: torch.Generator,
    frozen: tuple[str, ...] = (),
) -> tuple[dict[str, Tensor], list[float]]:
    """Plain PyTorch: load params, torch.optim.SGD over ``batch_schedule``'s batches."""
    model.load_state_dict({k: v.clone() for k, v in params.items()})
    for name, p in model.named_parameters():
        p.requires_grad_(name not in frozen)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(
        trainable, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    losses = []
    for idx in batch_schedule(data.num_examples, cfg, generator):
        opt.zero_grad()
        loss = F.cross_entropy(model(data.x[idx]), data.y[idx])
        loss.backward()
        if cfg.clip_grad_norm is not None:
            nn.utils.clip_grad_norm_(trainable, cfg.clip_grad_norm)
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().clone() for k, v in model.named_parameters()}, losses


def _assert_params_close(a: Mapping[str, Tensor], b: Mapping[str, Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "cfg",
    [
        LocalConfig(epochs=2, batch_size=8, lr=0.1),
        LocalConfig(epochs=3, batch_size=8, lr=0.1, momentum=0.9),
        LocalConfig(epochs=2, batch_size=5, lr=0.05, momentum=0.5, weight_decay=0.01),
        LocalConfig(epochs=None, steps=7, batch_size=4, lr=0.1, momentum=0.9, weight_decay=1e-3),
        LocalConfig(epochs=2, batch_size=4, lr=0.5, clip_grad_norm=0.1),
    ],
    ids=["plain", "momentum", "momentum+wd", "steps", "clip"],
)
def test_equals_torch_sgd(cfg: LocalConfig) -> None:
    model, data = _model(), _data()
    params = _params(model)
    gen = _gen()
    ref_gen = _clone(gen)
    result = local_sgd(model, params, data, cfg, gen)
    ref, ref_losses = _reference(_model(), params, data, cfg, ref_gen)
    _assert_params_close(result.params, ref)
    assert result.steps == len(ref_losses)
    assert result.loss == pytest.approx(sum(ref_losses) / len(ref_losses), rel=1e-6)
    assert not torch.equal(result.params["0.weight"], params["0.weight"])  # it did train


def test_epochs_schedule() -> None:
    cfg = LocalConfig(epochs=2, batch_size=8)
    batches = batch_schedule(N, cfg, _gen())
    assert [len(b) for b in batches] == [8, 8, 7, 8, 8, 7]  # last batch of each epoch partial
    for epoch in (batches[:3], batches[3:]):
        assert sorted(torch.cat(epoch).tolist()) == list(range(N))  # each epoch is a permutation
    assert not torch.equal(torch.cat(batches[:3]), torch.cat(batches[3:]))  # reshuffled


def test_steps_cut_after_exactly_steps_batches_spanning_epochs() -> None:
    # 23 examples, batch 8: 3 batches per epoch; 7 steps = 2 whole epochs + the first batch of a 3rd
    cfg = LocalConfig(epochs=None, steps=7, batch_size=8)
    batches = batch_schedule(N, cfg, _gen())
    assert [len(b) for b in batches] == [8, 8, 7, 8, 8, 7, 8]
    assert sorted(torch.cat(batches[:3]).tolist()) == list(range(N))
    assert sorted(torch.cat(batches[3:6]).tolist()) == list(range(N))
    # the first batch of the 3rd epoch is what a 3-epoch schedule would start its 3rd epoch with
    three_epochs = batch_schedule(N, LocalConfig(epochs=3, batch_size=8), _gen())
    assert all(torch.equal(a, b) for a, b in zip(batches, three_epochs[:7], strict=False))
    result = local_sgd(_model(), _params(_model()), _data(), cfg, _gen())
    assert result.steps == 7


def test_steps_fewer_than_one_epoch() -> None:
    cfg = LocalConfig(epochs=None, steps=2, batch_size=8)
    assert [len(b) for b in batch_schedule(N, cfg, _gen())] == [8, 8]


def test_empty_client() -> None:
    cfg = LocalConfig(epochs=1, batch_size=8)
    empty = ClientData(torch.zeros(0, D), torch.zeros(0, dtype=torch.long))
    params = _params(_model())
    result = local_sgd(_model(), params, empty, cfg, _gen())
    assert result.steps == 0
    assert all(torch.equal(result.params[k], params[k]) for k in params)


def test_config_rejects_both_epochs_and_steps() -> None:
    with pytest.raises(ValidationError, match="exactly one of epochs and steps"):
        LocalConfig(epochs=1, steps=3)


def test_config_defaults_to_one_epoch_and_steps_alone_is_enough() -> None:
    assert (LocalConfig().epochs, LocalConfig().steps) == (1, None)
    assert (LocalConfig(epochs=None, steps=None).epochs, LocalConfig(steps=7).epochs) == (1, None)
    assert LocalConfig(steps=7).steps == 7


@pytest.mark.parametrize(
    "bad", [{"epochs": 0}, {"batch_size": 0}, {"lr": 0.0}, {"momentum": 1.0}, {"nope": 1}]
)
def test_config_rejects(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        LocalConfig(**bad)


def test_input_params_not_mutated() -> None:
    model = _model()
    params = _params(model)
    before = {k: v.clone() for k, v in params.items()}
    model_before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    cfg = LocalConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.9)
    result = local_sgd(model, params, _data(), cfg, _gen())
    for k in params:
        assert torch.equal(params[k], before[k])
        assert result.params[k] is not params[k]
        assert not result.params[k].requires_grad
    for k, v in model.state_dict().items():
        assert torch.equal(v, model_before[k])  # the module is only a structure


def test_grad_hook_is_applied() -> None:
    # A hook adding wd·w to every gradient is weight decay.
    wd = 0.1
    base = LocalConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.9)
    params = _params(_model())

    def hook(full: Mapping[str, Tensor], grads: dict[str, Tensor]) -> dict[str, Tensor]:
        return {k: g + wd * full[k].detach() for k, g in grads.items()}

    hooked = local_sgd(_model(), params, _data(), base, _gen(), grad_hook=hook)
    decayed = local_sgd(
        _model(), params, _data(), base.model_copy(update={"weight_decay": wd}), _gen()
    )
    plain = local_sgd(_model(), params, _data(), base, _gen())
    _assert_params_close(hooked.params, decayed.params)
    assert not torch.allclose(hooked.params["0.weight"], plain.params["0.weight"])


def test_zero_grad_hook_freezes_everything() -> None:
    params = _params(_model())
    result = local_sgd(
        _model(),
        params,
        _data(),
        LocalConfig(epochs=1, batch_size=8),
        _gen(),
        grad_hook=lambda full, grads: {k: torch.zeros_like(g) for k, g in grads.items()},
    )
    assert all(torch.equal(result.params[k], params[k]) for k in params)


def test_loss_hook_l2_equals_weight_decay() -> None:
    # d/dw (wd/2)·‖w‖² = wd·w, so an L2 loss term equals SGD weight decay (without momentum).
    wd = 0.05
    cfg = LocalConfig(epochs=2, batch_size=8, lr=0.1)
    params = _params(_model())

    def l2(full: Mapping[str, Tensor], loss: Tensor) -> Tensor:
        return loss + 0.5 * wd * sum((v * v).sum() for v in full.values())

    hooked = local_sgd(_model(), params, _data(), cfg, _gen(), loss_hook=l2)
    decayed = local_sgd(
        _model(), params, _data(), cfg.model_copy(update={"weight_decay": wd}), _gen()
    )
    _assert_params_close(hooked.params, decayed.params)
    assert hooked.loss == pytest.approx(decayed.loss)  # the reported loss is the data loss


def test_post_step_is_applied_after_every_step() -> None:
    calls: list[int] = []
    mask = torch.tensor([[1.0, 0.0, 1.0, 0.0, 1.0]] * C)

    def project(live: dict[str, Tensor]) -> dict[str, Tensor]:
        calls.append(1)
        return {**live, "0.weight": live["0.weight"] * mask}

    cfg = LocalConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.9)
    result = local_sgd(_model(), _params(_model()), _data(), cfg, _gen(), post_step=project)
    assert len(calls) == result.steps == 6
    assert torch.all(result.params["0.weight"][:, [1, 3]] == 0)
    assert torch.all(result.params["0.weight"][:, [0, 2, 4]] != 0)


def test_trainable_freezes_parameters() -> None:
    cfg = LocalConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.9)
    params = _params(_model())
    gen = _gen()
    ref_gen = _clone(gen)
    result = local_sgd(_model(), params, _data(), cfg, gen, trainable={"0.bias": False})
    assert torch.equal(result.params["0.bias"], params["0.bias"])
    assert not torch.equal(result.params["0.weight"], params["0.weight"])
    ref, _ = _reference(_model(), params, _data(), cfg, ref_gen, frozen=("0.bias",))
    _assert_params_close(result.params, ref)


def test_same_seed_same_result_different_seed_different_result() -> None:
    cfg = LocalConfig(epochs=2, batch_size=8, lr=0.1)
    params = _params(_model())
    a = local_sgd(_model(), params, _data(), cfg, _gen(3))
    b = local_sgd(_model(), params, _data(), cfg, _gen(3))
    c = local_sgd(_model(), params, _data(), cfg, _gen(4))
    assert all(torch.equal(a.params[k], b.params[k]) for k in params)
    assert a.loss == b.loss
    assert not torch.equal(a.params["0.weight"], c.params["0.weight"])


def test_step_is_pure_and_vmaps_over_clients() -> None:
    """The step a vectorized backend batches: vmap over 3 clients == 3 sequential steps."""
    model = _model()
    cfg = LocalConfig(
        epochs=1, batch_size=8, lr=0.1, momentum=0.9, weight_decay=0.01, clip_grad_norm=0.5
    )
    anchor = _params(model)
    step = make_step(
        model, cfg, grad_hook=lambda p, g: {k: v + 0.1 * (p[k] - anchor[k]) for k, v in g.items()}
    )
    gen = torch.Generator().manual_seed(3)
    lives = [
        {k: v + 0.1 * torch.randn(v.shape, generator=gen) for k, v in anchor.items()}
        for _ in range(3)
    ]
    bufs = [{k: torch.randn(v.shape, generator=gen) for k, v in anchor.items()} for _ in range(3)]
    xs = torch.randn(3, 8, D, generator=gen)
    ys = torch.randint(0, C, (3, 8), generator=gen)
    before = {k: v.clone() for k, v in lives[0].items()}
    seq = [step(lives[i], bufs[i], {}, xs[i], ys[i]) for i in range(3)]
    assert all(torch.equal(before[k], lives[0][k]) for k in before)  # inputs untouched

    def stack(ds: list[dict[str, Tensor]]) -> dict[str, Tensor]:
        return {k: torch.stack([d[k] for d in ds]) for k in ds[0]}

    live_b, bufs_b, loss_b = torch.func.vmap(step, in_dims=(0, 0, None, 0, 0))(
        stack(lives), stack(bufs), {}, xs, ys
    )
    for i, (live, buf, loss) in enumerate(seq):
        for k in live:
            torch.testing.assert_close(live_b[k][i], live[k], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(bufs_b[k][i], buf[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(loss_b[i], loss)


def test_functional_and_eager_steps_agree() -> None:
    """The vectorized backend's functional step and the sequential backend's eager one."""
    model = _model()
    cfg = LocalConfig(
        epochs=2, batch_size=8, lr=0.1, momentum=0.9, weight_decay=0.01, clip_grad_norm=0.5
    )
    params = _params(model)

    def l1(p: Mapping[str, Tensor], loss: Tensor) -> Tensor:
        return loss + 1e-3 * p["0.weight"].abs().sum()

    eager = local_sgd(model, params, _data(), cfg, _gen(), loss_hook=l1)
    step = make_step(model, cfg, loss_hook=l1, functional=True)
    live = dict(params)
    bufs = {k: torch.zeros_like(v) for k, v in live.items()}
    data = _data()
    for idx in batch_schedule(data.num_examples, cfg, _gen()):
        live, bufs, _ = step(live, bufs, {}, data.x[idx], data.y[idx])
    for k in live:
        torch.testing.assert_close(live[k], eager.params[k], rtol=1e-5, atol=1e-6)


def test_aux_tensors_train_with_their_own_adamax() -> None:
    """Gate-like auxiliary tensors (forward uses W * sigmoid(v)) follow torch.optim.Adamax while
    the model weights follow SGD; both in the eager and the functional/vmapped step."""
    from fedcomm.algorithms.core.local import AuxAdamax, init_bufs

    model = _model()
    cfg = LocalConfig(epochs=2, batch_size=8, lr=0.1, momentum=0.5)
    aux = AuxAdamax(frozenset({"gate"}), lr=0.05)
    params = {**_params(model), "gate": torch.linspace(-1.0, 1.0, C)}

    def gated(full: dict[str, Tensor]) -> dict[str, Tensor]:
        return {**full, "0.weight": full["0.weight"] * torch.sigmoid(full["gate"])[:, None]}

    ours = local_sgd(model, params, _data(), cfg, _gen(), param_map=gated, aux=aux)

    w = params["0.weight"].clone().requires_grad_(True)
    b = params["0.bias"].clone().requires_grad_(True)
    v = params["gate"].clone().requires_grad_(True)
    sgd = torch.optim.SGD([w, b], lr=cfg.lr, momentum=cfg.momentum)
    adamax = torch.optim.Adamax([v], lr=0.05)
    data = _data()
    for idx in batch_schedule(data.num_examples, cfg, _gen()):
        loss = F.cross_entropy(data.x[idx] @ (w * torch.sigmoid(v)[:, None]).T + b, data.y[idx])
        sgd.zero_grad()
        adamax.zero_grad()
        loss.backward()
        sgd.step()
        adamax.step()
    torch.testing.assert_close(ours.params["0.weight"], w.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.params["gate"], v.detach(), rtol=1e-5, atol=1e-6)

    step = make_step(model, cfg, param_map=gated, aux=aux, functional=True)
    live = dict(params)
    bufs = init_bufs(live, cfg, aux)
    for idx in batch_schedule(data.num_examples, cfg, _gen()):
        live, bufs, _ = step(live, bufs, {}, data.x[idx], data.y[idx])
    torch.testing.assert_close(live["gate"], v.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("functional", [False, True])
def test_aux_tensors_with_the_sgd_rule_take_plain_gradient_steps(functional: bool) -> None:
    """``AuxAdamax(rule="sgd")`` (FedSparse's ``gate_optimizer: sgd`` diagnosis): the
    auxiliary tensors follow torch.optim.SGD at their own lr, not Adamax."""
    from fedcomm.algorithms.core.local import AuxAdamax

    model = _model()
    cfg = LocalConfig(epochs=1, batch_size=8, lr=0.1)
    aux = AuxAdamax(frozenset({"gate"}), lr=0.5, rule="sgd")
    params = {**_params(model), "gate": torch.linspace(-1.0, 1.0, C)}

    def gated(full: dict[str, Tensor]) -> dict[str, Tensor]:
        return {**full, "0.weight": full["0.weight"] * torch.sigmoid(full["gate"])[:, None]}

    w = params["0.weight"].clone().requires_grad_(True)
    b = params["0.bias"].clone().requires_grad_(True)
    v = params["gate"].clone().requires_grad_(True)
    opt_w, opt_v = torch.optim.SGD([w, b], lr=cfg.lr), torch.optim.SGD([v], lr=0.5)
    data = _data()
    for idx in batch_schedule(data.num_examples, cfg, _gen()):
        loss = F.cross_entropy(data.x[idx] @ (w * torch.sigmoid(v)[:, None]).T + b, data.y[idx])
        opt_w.zero_grad()
        opt_v.zero_grad()
        loss.backward()
        opt_w.step()
        opt_v.step()
    if functional:
        from fedcomm.algorithms.core.local import init_bufs

        step = make_step(model, cfg, param_map=gated, aux=aux, functional=True)
        live, bufs = dict(params), init_bufs(params, cfg, aux)
        for idx in batch_schedule(data.num_examples, cfg, _gen()):
            live, bufs, _ = step(live, bufs, {}, data.x[idx], data.y[idx])
        got = live["gate"]
    else:
        got = local_sgd(model, params, _data(), cfg, _gen(), param_map=gated, aux=aux)
        got = got.params["gate"]
    torch.testing.assert_close(got, v.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("functional", [False, True])
def test_skip_loss_leaves_params_and_momentum_unchanged(functional: bool) -> None:
    """ProgFed's guard: a step whose minibatch loss is >= skip_loss is not taken (both forms)."""
    model = _model()
    cfg = LocalConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.9)
    params = _params(model)
    data = _data()
    step = make_step(model, cfg, functional=functional, skip_loss=1e-9)  # every loss exceeds it
    live = {k: v.clone() for k, v in params.items()}
    bufs = {k: torch.full_like(v, 0.5) for k, v in live.items()}
    live, bufs, loss = step(live, bufs, {}, data.x[:8], data.y[:8])
    assert float(loss) > 0
    assert all(torch.equal(live[k], params[k]) for k in params)
    assert all(torch.equal(b, torch.full_like(b, 0.5)) for b in bufs.values())
    never = make_step(model, cfg, functional=functional, skip_loss=1e9)  # never fires
    moved, _, _ = never({k: v.clone() for k, v in params.items()}, bufs, {}, data.x, data.y)
    assert not torch.equal(moved["0.weight"], params["0.weight"])


def test_local_sgd_continues_from_given_momentum_and_returns_it() -> None:
    model = _model()
    cfg = LocalConfig(epochs=1, batch_size=8, lr=0.1, momentum=0.9)
    params = _params(model)
    fresh = local_sgd(model, params, _data(), cfg, _gen())
    assert set(fresh.bufs) == set(params) and any(b.abs().sum() > 0 for b in fresh.bufs.values())
    # two local rounds in a row with the momentum carried == one run over both epochs
    second = local_sgd(model, fresh.params, _data(), cfg, _clone_after(cfg), bufs=fresh.bufs)
    both = local_sgd(model, params, _data(), cfg.model_copy(update={"epochs": 2}), _gen())
    for k in params:
        torch.testing.assert_close(second.params[k], both.params[k], rtol=1e-5, atol=1e-6)
    reset = local_sgd(model, fresh.params, _data(), cfg, _clone_after(cfg))
    assert not torch.allclose(reset.params["0.weight"], second.params["0.weight"])


def _clone_after(cfg: LocalConfig) -> torch.Generator:
    """The generator as it is after one epoch's batch schedule of :func:`_gen`."""
    g = _gen()
    batch_schedule(N, cfg, g)
    return g
