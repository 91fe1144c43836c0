"""``train.backend: auto``: the documented rule, its log line, and runs equal to the chosen
backend's; the conv nets' channels-last forward (the reason the rule picks sequential for them
on the CPU) is the same function as the NCHW one."""

from __future__ import annotations

import logging

import pydantic
import pytest
import torch
import torch.nn.functional as F

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.comm.codecs import build_compressor
from fedcomm.config import TrainConfig
from fedcomm.models import build_model
from fedcomm.models.vision import channels_last
from fedcomm.simulation import auto_backend, loop
from fedcomm.simulation.data import FederatedTensors
from tests.conftest import digits_federation, small_loop, tiny_cnn

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


@pytest.mark.parametrize(
    ("name", "shape", "kw", "expected"),
    [
        ("cnn", (3, 32, 32), {}, "sequential"),
        ("feddst_cnn", (3, 32, 32), {}, "sequential"),
        ("resnet20", (3, 32, 32), {}, "sequential"),
        ("mlp", (1, 28, 28), {"hidden": [8]}, "vectorized"),
        ("lstm", (35,), {"embed_dim": 8, "hidden": 8}, "sequential"),
    ],
)
def test_rule_on_the_cpu_is_keyed_on_convolutions_and_recurrent_layers(
    name: str, shape: tuple[int, ...], kw: dict[str, object], expected: str
) -> None:
    model = build_model(name, input_shape=shape, num_classes=10, **kw)
    chosen, why = auto_backend.choose(model, CPU)
    assert chosen == expected
    assert ("Conv2d" in why or "GateLSTM" in why) == (expected == "sequential")


@pytest.mark.parametrize("kind", ["cuda", "mps"])
def test_rule_on_an_accelerator_is_vectorized(kind: str) -> None:
    model = build_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    chosen, why = auto_backend.choose(model, torch.device(kind))  # (no device is touched)
    assert chosen == "vectorized"
    assert kind in why


def test_named_backends_are_kept() -> None:
    model = build_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    assert auto_backend.resolve("vectorized", model, CPU) == "vectorized"
    assert auto_backend.resolve("sequential", model, CPU) == "sequential"


@pytest.mark.parametrize(("model_kind", "expected"), [("cnn", "sequential"), ("mlp", "vectorized")])
def test_auto_runs_as_its_choice_and_logs_it_once(
    model_kind: str, expected: str, fed: FederatedTensors, caplog: pytest.LogCaptureFixture
) -> None:
    def run(backend: str) -> loop.RunResult:
        model, cfg = small_loop(fed, backend=backend)
        if model_kind == "cnn":
            model = tiny_cnn(fed)
        algorithm = build_algorithm(CONFIGS["fedavg"]().with_rounds(cfg.rounds))
        return loop.run(cfg, algorithm, model, fed, build_compressor("none"), config_hash="auto")

    with caplog.at_level(logging.INFO, logger="fedcomm.backend"):
        auto = run("auto")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("backend auto")]
    assert lines == [lines[0]] and lines[0].startswith(f"backend auto: {expected} (")
    assert auto.backend == expected
    named = run(expected)  # the same backend: the same numbers, to the bit
    for k, v in named.final_params.items():
        assert torch.equal(auto.final_params[k], v), k
    assert auto.ledger.rows == named.ledger.rows


def test_config_accepts_auto_and_names_the_allowed_values() -> None:
    assert TrainConfig(rounds=1, clients_per_round=1, backend="auto").backend == "auto"
    with pytest.raises(pydantic.ValidationError, match="auto"):
        TrainConfig(rounds=1, clients_per_round=1, backend="fastest")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "shape", "kw"),
    [
        ("cnn", (3, 32, 32), {}),
        ("mnist_cnn", (1, 28, 28), {"channels": [4, 8], "hidden": 16}),
        ("feddst_cnn", (3, 32, 32), {}),
    ],
)
def test_channels_last_forward_is_the_nchw_function(
    name: str, shape: tuple[int, ...], kw: dict[str, object]
) -> None:
    """The conv nets run channels-last (and ReLU after the pooling, which is exact): outputs and
    gradients equal the plain NCHW conv-ReLU-pool forward to float rounding."""
    torch.manual_seed(0)
    model = build_model(name, input_shape=shape, num_classes=10, **kw)
    x = torch.randn(8, *shape)
    y = torch.randint(0, 10, (8,))

    def nchw(x: torch.Tensor) -> torch.Tensor:  # the textbook order, in the default layout
        m = model
        if name == "feddst_cnn":
            h = F.relu(F.max_pool2d(m.conv1(x), 3, stride=1))
            h = F.relu(F.max_pool2d(m.conv2(h), 3, stride=1)).flatten(1)
            for i in range(1, m.num_fc):
                h = F.relu(getattr(m, f"fc{i}")(h))
            return getattr(m, f"fc{m.num_fc}")(h)
        h = F.max_pool2d(F.relu(m.conv1(x)), 2)
        h = F.max_pool2d(F.relu(m.conv2(h)), 2)
        return m.fc2(F.relu(m.fc1(h.flatten(1))))

    def grads(f: object) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        out = f(x)  # type: ignore[operator]
        F.cross_entropy(out, y).backward()
        return out.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    out_a, g_a = grads(model)
    out_b, g_b = grads(nchw)
    torch.testing.assert_close(out_a, out_b, rtol=1e-5, atol=1e-6)
    assert len(g_a) == len(g_b) == len(list(model.parameters()))
    for a, b in zip(g_a, g_b, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert channels_last(x).is_contiguous(memory_format=torch.channels_last)
    assert channels_last(x[0]) is not None and channels_last(x[0]).shape == x[0].shape


def test_channels_last_is_skipped_under_vmap() -> None:
    """vmap has no channels-last clone: inside it the input is left as it is (NCHW)."""
    x = torch.randn(3, 2, 4, 6, 6)
    out = torch.func.vmap(lambda t: channels_last(t) * 2)(x)
    torch.testing.assert_close(out, x * 2)
