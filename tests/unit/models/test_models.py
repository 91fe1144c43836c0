"""Registry, parameter counts, shapes and the no-buffer contract of every registered model."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call

from fedcomm.models import MODELS, build_model, num_parameters, option_names, register

# name -> (input_shape, num_classes, small options, expected output shape for a batch of 2)
SMALL: dict[str, tuple[tuple[int, ...], int, dict[str, Any], tuple[int, ...]]] = {
    "mlp": ((1, 8, 8), 5, {"hidden": [16, 8]}, (2, 5)),
    "cnn": ((3, 16, 16), 7, {"channels": [4, 8], "hidden": 16}, (2, 7)),
    "mnist_cnn": ((1, 12, 12), 10, {"channels": [4, 8], "hidden": 16}, (2, 10)),
    "feddst_cnn": ((2, 14, 15), 6, {"channels": [3, 4], "hidden": [5, 7]}, (2, 6)),
    "resnet20": ((3, 8, 8), 10, {}, (2, 10)),
    "resnet18": ((3, 4, 4), 10, {}, (2, 10)),
    "progfed_emnist_cnn": ((1, 10, 10), 6, {}, (2, 6)),
    "progfed_cifar_cnn": ((3, 18, 19), 4, {}, (2, 4)),
    "lstm": ((6,), 13, {"embed_dim": 8, "hidden": 12}, (2, 6, 13)),
}


def small(name: str) -> nn.Module:
    shape, classes, options, _ = SMALL[name]
    return build_model(name, input_shape=shape, num_classes=classes, **options)


def example_input(name: str) -> torch.Tensor:
    shape = SMALL[name][0]
    if name == "lstm":
        return torch.randint(0, SMALL[name][1], (2, *shape))  # (B, T) int64
    return torch.randn(2, *shape)


def test_every_registered_model_has_a_small_config() -> None:
    assert set(SMALL) == set(MODELS)


@pytest.mark.parametrize(
    ("name", "shape", "classes", "options", "expected"),
    [
        ("cnn", (3, 32, 32), 10, {}, 878_538),  # FedSparse CIFAR-10
        ("cnn", (1, 28, 28), 62, {}, 608_702),  # FedSparse FEMNIST
        ("mlp", (1, 28, 28), 10, {"hidden": [128]}, 101_770),  # FedBIAD MNIST
        ("mlp", (784,), 10, {"hidden": [256]}, 203_530),  # FedBIAD FMNIST
        ("mnist_cnn", (1, 28, 28), 10, {}, 1_663_370),  # FedAvg CNN
        ("feddst_cnn", (1, 28, 28), 10, {}, 261_840),  # FedDST MNISTNet
        ("feddst_cnn", (3, 32, 32), 10, {}, 782_006),  # FedDST CIFAR10Net
        ("feddst_cnn", (3, 32, 32), 100, {}, 783_092),  # FedDST CIFAR100Net
        ("feddst_cnn", (3, 32, 32), 10, {"channels": [6, 16], "hidden": [120, 84]}, 782_006),
        ("feddst_cnn", (3, 32, 32), 100, {"channels": [6, 16], "hidden": [120]}, 783_092),
        ("resnet20", (3, 32, 32), 10, {}, 272_474),  # option B projections
        ("resnet20", (3, 32, 32), 100, {"shortcut": "A"}, 275_572),  # FedSparse's ~275.6k
        ("resnet18", (3, 32, 32), 100, {}, 11_220_132),  # ProgFed CIFAR-100 (GroupNorm)
        ("progfed_emnist_cnn", (1, 28, 28), 62, {}, 1_206_590),  # ProgFed EMNIST ConvNet
        ("progfed_cifar_cnn", (3, 32, 32), 10, {}, 122_570),  # ProgFed CIFAR-10 (paper)
        ("lstm", (35,), 10_000, {}, 7_454_800),  # FedBIAD PTB LM, 29.8 MB
    ],
)
def test_parameter_counts(
    name: str, shape: tuple[int, ...], classes: int, options: dict[str, Any], expected: int
) -> None:
    model = build_model(name, input_shape=shape, num_classes=classes, **options)
    assert num_parameters(model) == expected


@pytest.mark.parametrize("name", sorted(SMALL))
def test_forward_shape(name: str) -> None:
    assert small(name)(example_input(name)).shape == SMALL[name][3]


@pytest.mark.parametrize("name", sorted(SMALL))
def test_no_buffers(name: str) -> None:
    assert list(small(name).buffers()) == []


@pytest.mark.parametrize("name", sorted(SMALL))
def test_deterministic_init(name: str) -> None:
    torch.manual_seed(0)
    a = small(name).state_dict()
    torch.manual_seed(0)
    b = small(name).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_functional_call_covers_all_state(name: str) -> None:
    model, x = small(name).eval(), example_input(name)  # eval: no dropout noise
    params: dict[str, torch.Tensor] = dict(model.named_parameters())
    assert torch.equal(functional_call(model, params, (x,)), model(x))
    zeros = {k: torch.zeros_like(v) for k, v in params.items()}
    assert torch.count_nonzero(functional_call(model, zeros, (x,))) == 0


def test_full_size_forward_shapes() -> None:
    assert build_model("cnn", input_shape=(3, 32, 32), num_classes=10)(
        torch.randn(2, 3, 32, 32)
    ).shape == (2, 10)
    assert build_model("mnist_cnn", input_shape=(1, 28, 28), num_classes=10)(
        torch.randn(2, 1, 28, 28)
    ).shape == (2, 10)
    resnet = build_model("resnet20", input_shape=(3, 32, 32), num_classes=100, shortcut="A")
    assert resnet(torch.randn(2, 3, 32, 32)).shape == (2, 100)


def test_lstm_last_output_and_tied_weights() -> None:
    tokens = torch.randint(0, 20, (2, 5))  # (B, T)
    last = build_model(
        "lstm", input_shape=(5,), num_classes=20, embed_dim=8, hidden=8, output="last"
    )
    assert last(tokens).shape == (2, 20)
    tied = build_model(
        "lstm", input_shape=(5,), num_classes=20, embed_dim=8, hidden=8, tie_weights=True
    )
    assert num_parameters(last) - num_parameters(tied) == 20 * 8
    assert tied.decoder.weight is tied.embedding.weight
    assert tied(tokens).shape == (2, 5, 20)


def test_unknown_model_lists_registered_names() -> None:
    with pytest.raises(ValueError, match=r"registered: .*'cnn'.*'mlp'"):
        build_model("vgg", input_shape=(3, 32, 32), num_classes=10)


def test_unknown_option_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown option.*'hiden'.*accepted: \['hidden'\]"):
        build_model("mlp", input_shape=(4,), num_classes=2, hiden=[3])
    assert option_names("resnet20") == ("groups", "shortcut")


@pytest.mark.parametrize(
    ("name", "shape", "options", "option"),
    [
        ("mlp", (4,), {"hidden": [3, 0]}, "hidden"),
        ("mlp", (4,), {"hidden": "12"}, "hidden"),
        ("cnn", (3, 32, 32), {"channels": [4]}, "channels"),
        ("cnn", (3, 8, 8), {}, "input_shape"),
        ("cnn", (3, 32), {}, "input_shape"),
        ("mnist_cnn", (1, 28, 28), {"hidden": 1.5}, "hidden"),
        ("feddst_cnn", (1, 12, 28), {}, "input_shape"),
        ("feddst_cnn", (1, 28, 28), {"channels": [10, 20, 30]}, "channels"),
        ("feddst_cnn", (1, 28, 28), {"hidden": 50}, "hidden"),
        ("resnet20", (3, 32, 32), {"groups": 3}, "groups"),
        ("resnet20", (3, 32, 32), {"shortcut": "C"}, "shortcut"),
        ("resnet18", (3, 32, 32), {"groups": 3}, "groups"),
        ("resnet18", (32, 32), {}, "input_shape"),
        ("progfed_emnist_cnn", (1, 5, 28), {}, "input_shape"),
        ("progfed_emnist_cnn", (1, 28, 28), {"dropout": 0.5}, "dropout"),
        ("progfed_cifar_cnn", (3, 17, 32), {}, "input_shape"),
        ("progfed_cifar_cnn", (3, 32), {}, "input_shape"),
        ("lstm", (5,), {"output": "all"}, "output"),
        ("lstm", (5,), {"num_layers": 0}, "num_layers"),
        ("lstm", (5,), {"tie_weights": True, "embed_dim": 4, "hidden": 8}, "tie_weights"),
        ("lstm", (3, 5), {}, "input_shape"),
    ],
)
def test_bad_option_value_is_named(
    name: str, shape: tuple[int, ...], options: dict[str, Any], option: str
) -> None:
    with pytest.raises(ValueError, match=f"'{option}'"):
        build_model(name, input_shape=shape, num_classes=3, **options)


def test_register_rejects_duplicates_and_bad_signatures() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register("mlp")(MODELS["mlp"])

    def no_shape(*, num_classes: int) -> nn.Module:
        return nn.Linear(1, num_classes)

    with pytest.raises(TypeError, match="input_shape"):
        register("broken")(no_shape)
    assert "broken" not in MODELS


@pytest.mark.parametrize(
    ("shape", "classes", "options", "layers"),
    [  # (layer, weight shape) in forward order: FedDST models.py MNISTNet and CIFAR10Net
        (
            (1, 28, 28),
            10,
            {},
            [("conv1", (10, 1, 5, 5)), ("conv2", (20, 10, 5, 5)), ("fc1", (50, 5120)),
             ("fc2", (10, 50))],
        ),
        (
            (3, 32, 32),
            10,
            {"channels": [6, 16], "hidden": [120, 84]},
            [("conv1", (6, 3, 5, 5)), ("conv2", (16, 6, 5, 5)), ("fc1", (120, 6400)),
             ("fc2", (84, 120)), ("fc3", (10, 84))],
        ),
    ],
)  # fmt: skip
def test_feddst_cnn_layers_in_forward_order(
    shape: tuple[int, ...],
    classes: int,
    options: dict[str, Any],
    layers: list[tuple[str, tuple[int, ...]]],
) -> None:
    from fedcomm.models import groups, rows

    model = build_model("feddst_cnn", input_shape=shape, num_classes=classes, **options)
    weights = [(k.removesuffix(".weight"), tuple(v.shape)) for k, v in model.named_parameters()]
    assert [w for w in weights if len(w[1]) > 1] == layers
    names = [name for name, _ in layers]
    for specs in (groups(model), rows(model)):
        assert [s.name for s in specs] == names
        assert [s.is_output for s in specs] == [False] * (len(names) - 1) + [True]
    assert model(torch.randn(3, *shape)).shape == (3, classes)


def test_feddst_cnn_returns_logits_not_probabilities() -> None:
    torch.manual_seed(0)
    model = build_model("feddst_cnn", input_shape=(1, 28, 28), num_classes=10)
    out = model(torch.randn(4, 1, 28, 28))
    assert not torch.allclose(out.sum(1), torch.ones(4))  # no softmax at the end
    assert (out < 0).any()


def test_feddst_cnn_matches_the_official_forward_without_softmax() -> None:
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = build_model(
        "feddst_cnn", input_shape=(3, 32, 32), num_classes=10, channels=[6, 16], hidden=[120, 84]
    )
    m = dict(model.named_children())
    x = torch.randn(2, 3, 32, 32)
    # FedDST models.py CIFAR10Net.forward, minus its final softmax
    h = F.relu(F.max_pool2d(m["conv1"](x), 3, stride=1))
    h = F.relu(F.max_pool2d(m["conv2"](h), 3, stride=1))
    h = h.view(-1, 16 * 20 * 20)
    h = F.relu(m["fc2"](F.relu(m["fc1"](h))))
    torch.testing.assert_close(model(x), m["fc3"](h))


def _feddst_model_from_params(
    params: Any, input_shape: tuple[int, ...], num_classes: int
) -> nn.Module:
    """The model ``fedcomm train`` builds (``stages.train.build_run_model``) for data of this
    shape: the params' model section through ``model_options`` and the registry."""
    from types import SimpleNamespace

    from fedcomm.stages.train import build_run_model

    data = SimpleNamespace(input_shape=input_shape, num_classes=num_classes)
    return build_run_model(params, data, seed=0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("dataset", "shape", "classes", "expected"),
    [
        ("mnist", (1, 28, 28), 10, 261_840),  # MNISTNet
        ("cifar10", (3, 32, 32), 10, 782_006),  # CIFAR10Net (was 406,340: the MNIST widths)
        ("cifar100", (3, 32, 32), 100, 783_092),  # CIFAR100Net
    ],
)
def test_feddst_cnn_config_defaults_give_the_papers_net_for_the_input(
    dataset: str, shape: tuple[int, ...], classes: int, expected: int
) -> None:
    from fedcomm.config import validate_params
    from tests.conftest import tiny_params

    raw = tiny_params(**{"data.dataset": {"name": dataset}, "model": {"name": "feddst_cnn"}})
    params = validate_params(raw)
    assert params.model.channels is None and params.model.hidden is None  # type: ignore[union-attr]
    model = _feddst_model_from_params(params, shape, classes)
    assert num_parameters(model) == expected
    assert model(torch.randn(2, *shape)).shape == (2, classes)


@pytest.mark.parametrize(
    ("shape", "options", "expected", "conv1", "fc_out"),
    [  # explicit widths win over the input's defaults, each option on its own too
        ((3, 32, 32), {"channels": [10, 20], "hidden": [50]}, 406_340, (10, 3, 5, 5), [50, 10]),
        ((1, 28, 28), {"channels": [6, 16], "hidden": [120, 84]}, 505_226, (6, 1, 5, 5),
         [120, 84, 10]),
        ((3, 32, 32), {"hidden": []}, 66_882, (6, 3, 5, 5), [10]),
        ((1, 28, 28), {"channels": [6, 16]}, 207_932, (6, 1, 5, 5), [50, 10]),
    ],
)  # fmt: skip
def test_feddst_cnn_explicit_widths_override_the_defaults(
    shape: tuple[int, ...],
    options: dict[str, Any],
    expected: int,
    conv1: tuple[int, ...],
    fc_out: list[int],
) -> None:
    from fedcomm.config import validate_params
    from tests.conftest import tiny_params

    params = validate_params(tiny_params(model={"name": "feddst_cnn", **options}))
    for model in (
        _feddst_model_from_params(params, shape, 10),
        build_model("feddst_cnn", input_shape=shape, num_classes=10, **options),
    ):
        assert num_parameters(model) == expected
        assert tuple(dict(model.named_parameters())["conv1.weight"].shape) == conv1
        fcs = [m.out_features for n, m in model.named_children() if n.startswith("fc")]
        assert fcs == fc_out


def test_feddst_cnn_default_widths_for_data_the_paper_did_not_use() -> None:
    from fedcomm.models.vision import FEDDST_CIFAR10, FEDDST_MNIST, feddst_widths

    assert feddst_widths((1, 28, 28), 62) == FEDDST_MNIST  # FEMNIST: the MNIST net
    assert feddst_widths((3, 32, 32), 20) == FEDDST_CIFAR10  # CIFAR-100 coarse: CIFAR-10 net
    model = build_model("feddst_cnn", input_shape=(1, 28, 28), num_classes=62)
    assert num_parameters(model) == 261_840 - 510 + 50 * 62 + 62


def test_feddst_mnist_reproduction_still_builds_the_mnist_net() -> None:
    from fedcomm.config import load_params
    from tests.conftest import REPO

    params = load_params(REPO / "pipeline" / "reproductions" / "feddst_mnist.yaml")
    assert num_parameters(_feddst_model_from_params(params, (1, 28, 28), 10)) == 261_840


@pytest.mark.parametrize("layers", [1, 2])
def test_gate_lstm_is_nn_lstm_in_both_forms(layers: int) -> None:
    """Same init (same seed -> same parameters, names and order), the fused form bit-identical
    to ``nn.LSTM``, the unrolled gate form equal up to rounding in outputs, final state and
    gradients, and the unrolled form batched by vmap equal to a loop over clients."""
    from fedcomm.models.lstm import GateLSTM, unrolled

    torch.manual_seed(3)
    ref = torch.nn.LSTM(6, 10, layers, batch_first=True)
    torch.manual_seed(3)
    gate = GateLSTM(6, 10, layers)
    assert [n for n, _ in ref.named_parameters()] == [n for n, _ in gate.named_parameters()]
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), gate.parameters(), strict=True))
    x = torch.randn(4, 7, 6)
    y_ref, (h_ref, c_ref) = ref(x)
    assert torch.equal(gate(x)[0], y_ref)  # fused: the same kernel
    with unrolled(gate):
        y, (h, c) = gate(x)
    assert not gate.unrolled  # restored after the block
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, h_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(c, c_ref, rtol=1e-5, atol=1e-6)
    g_ref = torch.autograd.grad(y_ref.square().sum(), list(ref.parameters()))
    with unrolled(gate):
        g = torch.autograd.grad(gate(x)[0].square().sum(), list(gate.parameters()))
    for a, b in zip(g, g_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    # vmap over 3 clients' parameter sets == each client on its own
    named = dict(gate.named_parameters())
    params = {n: torch.stack([p.detach() + 0.01 * i for i in range(3)]) for n, p in named.items()}
    xs = torch.randn(3, 4, 7, 6)
    with unrolled(gate):
        batched = torch.func.vmap(lambda p, xb: torch.func.functional_call(gate, p, (xb,))[0])(
            params, xs
        )
    for i in range(3):
        one = torch.func.functional_call(gate, {n: v[i] for n, v in params.items()}, (xs[i],))[0]
        torch.testing.assert_close(batched[i], one, rtol=1e-5, atol=1e-6)


def test_feddst_cnn_softmax_output_is_the_official_nets_double_softmax() -> None:
    """``softmax_output``: the net ends in softmax, as bibikar/feddst's; the same weights give
    the softmax of the logits (so the same argmax), and the cross-entropy on it is the
    official code's double softmax: at most log(e + C − 1), whatever the logits."""
    torch.manual_seed(0)
    plain = build_model("feddst_cnn", input_shape=(3, 32, 32), num_classes=10)
    soft = build_model("feddst_cnn", input_shape=(3, 32, 32), num_classes=10, softmax_output=True)
    soft.load_state_dict(plain.state_dict())
    x = torch.randn(5, 3, 32, 32) * 30
    logits, probs = plain(x), soft(x)
    torch.testing.assert_close(probs, torch.softmax(logits, 1))
    assert torch.equal(probs.argmax(1), logits.argmax(1))
    y = probs.argmin(1)  # the least likely class as the target
    loss = torch.nn.functional.cross_entropy(probs, y, reduction="none")
    assert float(loss.max()) <= math.log(9 + math.e)
    assert float(torch.nn.functional.cross_entropy(logits, y, reduction="none").max()) > 3
