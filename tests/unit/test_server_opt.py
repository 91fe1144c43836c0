"""Server optimizers on the mean delta: equal to torch.optim with gradient ``-Δ``, and pure."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from pydantic import ValidationError

from fedcomm import server_opt
from fedcomm.server_opt import ServerOptConfig, Transform, apply_step

STEPS = 5


def _params() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g)}


def _deltas() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g)}
        for _ in range(STEPS)
    ]


def _run(t: Transform) -> dict[str, torch.Tensor]:
    params = _params()
    state = t.init(params)
    for delta in _deltas():
        step, state = t.update(delta, state)
        params = apply_step(params, step)
    return params


def _torch_reference(
    make: Callable[[list[torch.Tensor]], torch.optim.Optimizer],
) -> dict[str, torch.Tensor]:
    """The same trajectory with a torch optimizer fed the descent gradient ``-Δ``."""
    params = {k: v.clone().requires_grad_(True) for k, v in _params().items()}
    opt = make(list(params.values()))
    for delta in _deltas():
        for k, p in params.items():
            p.grad = -delta[k].clone()
        opt.step()
    return {k: v.detach() for k, v in params.items()}


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_sgd_lr1_is_plain_averaging() -> None:
    # w = [1, 2], client models [2, 2] and [4, 0]: Δ = mean([1, 0], [3, -2]) = [2, -1]
    # -> w + Δ = [3, 1] = mean of the client models.
    t = server_opt.sgd(1.0)
    w = {"w": torch.tensor([1.0, 2.0])}
    clients = [torch.tensor([2.0, 2.0]), torch.tensor([4.0, 0.0])]
    delta = {"w": torch.stack([c - w["w"] for c in clients]).mean(0)}
    step, _ = t.update(delta, t.init(w))
    assert apply_step(w, step)["w"].tolist() == [3.0, 1.0]


def test_sgd_scales_by_lr() -> None:
    t = server_opt.sgd(0.5)
    step, _ = t.update({"w": torch.tensor([2.0, -4.0])}, t.init({"w": torch.zeros(2)}))
    assert step["w"].tolist() == [1.0, -2.0]


def test_momentum_by_hand() -> None:
    # β = 0.5, lr = 2, Δ = 1 twice: m1 = 1, step 2; m2 = 0.5 + 1 = 1.5, step 3.
    t = server_opt.momentum(lr=2.0, beta=0.5)
    state = t.init({"w": torch.zeros(1)})
    step, state = t.update({"w": torch.ones(1)}, state)
    assert step["w"].item() == 2.0
    step, state = t.update({"w": torch.ones(1)}, state)
    assert step["w"].item() == 3.0


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_equals_torch_sgd(nesterov: bool) -> None:
    ours = _run(server_opt.momentum(lr=0.7, beta=0.9, nesterov=nesterov))
    ref = _torch_reference(lambda ps: torch.optim.SGD(ps, lr=0.7, momentum=0.9, nesterov=nesterov))
    _assert_close(ours, ref)


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.5, 0.9)])
def test_adam_equals_torch_adam(betas: tuple[float, float]) -> None:
    ours = _run(server_opt.adam(lr=0.1, b1=betas[0], b2=betas[1], eps=1e-3))
    ref = _torch_reference(lambda ps: torch.optim.Adam(ps, lr=0.1, betas=betas, eps=1e-3))
    _assert_close(ours, ref)


def test_adam_first_step_by_hand() -> None:
    # bias-corrected first step: m̂ = Δ, v̂ = Δ², step = lr · Δ / (|Δ| + eps)
    t = server_opt.adam(lr=0.1, eps=1.0)
    step, _ = t.update({"w": torch.tensor([3.0, -1.0])}, t.init({"w": torch.zeros(2)}))
    assert step["w"].tolist() == pytest.approx([0.1 * 3 / 4, 0.1 * -1 / 2])


def test_adam_without_bias_correction_by_hand() -> None:
    # no correction: m = (1 - b1)Δ = 0.1Δ, v = (1 - b2)Δ² -> sqrt(v) = 0.1|Δ| with b2 = 0.99
    t = server_opt.adam(lr=1.0, b1=0.9, b2=0.99, eps=0.0, bias_correction=False)
    step, _ = t.update({"w": torch.tensor([2.0])}, t.init({"w": torch.zeros(1)}))
    assert step["w"].item() == pytest.approx(0.2 / 0.2)


def test_adamax_equals_torch_adamax() -> None:
    ours = _run(server_opt.adamax(lr=0.05, b1=0.8, b2=0.95, eps=1e-8))
    ref = _torch_reference(lambda ps: torch.optim.Adamax(ps, lr=0.05, betas=(0.8, 0.95), eps=1e-8))
    _assert_close(ours, ref)


def test_chain_composes_in_order() -> None:
    # trace(0.5) then scale(2): m1 = Δ, step 2Δ; m2 = 0.5Δ + Δ, step 3Δ
    t = server_opt.chain(server_opt.trace(0.5), server_opt.scale(2.0))
    delta = {"w": torch.tensor([1.0, -2.0])}
    state = t.init({"w": torch.zeros(2)})
    assert len(state) == 2
    step, state = t.update(delta, state)
    assert step["w"].tolist() == [2.0, -4.0]
    step, state = t.update(delta, state)
    assert step["w"].tolist() == [3.0, -6.0]
    # scale then scale multiplies
    t2 = server_opt.chain(server_opt.scale(3.0), server_opt.scale(0.5))
    step, _ = t2.update(delta, t2.init(delta))
    assert step["w"].tolist() == [1.5, -3.0]


def test_chain_equals_preset() -> None:
    manual = server_opt.chain(server_opt.scale_by_adam(0.9, 0.99, 1e-3), server_opt.scale(0.1))
    _assert_close(_run(manual), _run(server_opt.adam(lr=0.1, b1=0.9, b2=0.99, eps=1e-3)))


@pytest.mark.parametrize(
    ("cfg", "preset"),
    [
        (ServerOptConfig(), server_opt.sgd(1.0)),
        (ServerOptConfig(optimizer="sgd", lr=0.3), server_opt.sgd(0.3)),
        (
            ServerOptConfig(optimizer="momentum", lr=0.5, momentum=0.8, nesterov=True),
            server_opt.momentum(0.5, 0.8, nesterov=True),
        ),
        (
            ServerOptConfig(optimizer="adam", lr=0.1, beta1=0.8, beta2=0.9, eps=1e-3),
            server_opt.adam(0.1, 0.8, 0.9, 1e-3),
        ),
        (
            ServerOptConfig(optimizer="adam", lr=0.1, eps=1e-3, bias_correction=False),
            server_opt.adam(0.1, eps=1e-3, bias_correction=False),
        ),
        (
            ServerOptConfig(optimizer="adamax", lr=0.05, beta1=0.7, beta2=0.9),
            server_opt.adamax(0.05, 0.7, 0.9),
        ),
    ],
)
def test_config_builds_the_preset(cfg: ServerOptConfig, preset: Transform) -> None:
    assert torch.equal(_run(cfg.build())["w"], _run(preset)["w"])


def test_config_builds_differ_by_optimizer() -> None:
    results = {
        name: _run(ServerOptConfig(optimizer=name, lr=0.1).build())["w"]
        for name in ("sgd", "momentum", "adam", "adamax")
    }
    names = list(results)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert not torch.allclose(results[a], results[b]), (a, b)


@pytest.mark.parametrize(
    "bad",
    [{"optimizer": "yogi"}, {"lr": 0.0}, {"momentum": 1.0}, {"eps": 0.0}, {"unknown": 1}],
)
def test_config_rejects(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        ServerOptConfig(**bad)


@pytest.mark.parametrize(
    "transform",
    [
        server_opt.sgd(0.5),
        server_opt.momentum(0.5, 0.9),
        server_opt.momentum(0.5, 0.9, nesterov=True),
        server_opt.adam(0.1),
        server_opt.adamax(0.1),
    ],
    ids=["sgd", "momentum", "nesterov", "adam", "adamax"],
)
def test_update_is_pure(transform: Transform) -> None:
    params = _params()
    params_before = {k: v.clone() for k, v in params.items()}
    state = transform.init(params)
    deltas = _deltas()
    _, state = transform.update(deltas[0], state)  # one step so the buffers are non-zero
    snapshot = _clone_tree(state)
    delta_before = {k: v.clone() for k, v in deltas[1].items()}

    step1, _ = transform.update(deltas[1], state)
    _assert_tree_equal(state, snapshot)  # old state untouched
    assert all(torch.equal(deltas[1][k], delta_before[k]) for k in delta_before)
    step2, _ = transform.update(deltas[1], state)  # same input, same output
    _assert_tree_equal(step1, step2)
    apply_step(params, step1)
    assert all(torch.equal(params[k], params_before[k]) for k in params)


def test_apply_step_leaves_params_without_a_step() -> None:
    params = {"a": torch.tensor([1.0]), "b": torch.tensor([2.0])}
    out = apply_step(params, {"a": torch.tensor([0.5])})
    assert out["a"].item() == 1.5
    assert out["b"].item() == 2.0


def _clone_tree(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, dict):
        return {k: _clone_tree(v) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(_clone_tree(v) for v in x)
    return x


def _assert_tree_equal(a: object, b: object) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict)
        assert a.keys() == b.keys()
        for k in a:
            _assert_tree_equal(a[k], b[k])
    elif isinstance(a, tuple):
        assert isinstance(b, tuple)
        assert len(a) == len(b)
        for u, v in zip(a, b, strict=True):
            _assert_tree_equal(u, v)
    else:
        assert a == b


def test_apply_is_update_then_apply_step_and_held_masks_the_step() -> None:
    """``Transform.apply`` (the server step every algorithm takes) is ``update`` followed by
    :func:`apply_step`, to the bit; with ``held`` an entry nobody held keeps its value while the
    optimizer's state still advances there."""
    t = ServerOptConfig(optimizer="adam", lr=0.1).build()
    params, state = _params(), t.init(_params())
    ref_params, ref_state = _params(), t.init(_params())
    for delta in _deltas():
        params, state = t.apply(params, delta, state)
        step, ref_state = t.update(delta, ref_state)
        ref_params = apply_step(ref_params, step)
    _assert_tree_equal(params, ref_params)
    _assert_tree_equal(state, ref_state)

    held = {"w": torch.zeros(3, 4, dtype=torch.bool), "b": torch.ones(4, dtype=torch.bool)}
    held["w"][0] = True
    new, new_state = t.apply(params, _deltas()[0], state, held)
    step, ref_state = t.update(_deltas()[0], state)
    assert torch.equal(new["w"][1:], params["w"][1:])  # not held: unchanged
    assert torch.equal(new["w"][0], params["w"][0] + step["w"][0])
    assert torch.equal(new["b"], params["b"] + step["b"])
    _assert_tree_equal(new_state, ref_state)
