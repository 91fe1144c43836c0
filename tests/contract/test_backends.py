"""The vectorized backend against the sequential reference, over the whole registry.

Every registered algorithm and every registered uplink compressor runs a few rounds on both
backends; the metrics must agree within float tolerance (batched matmuls sum in another order),
the ledgers exactly, the final models closely. Algorithms the vectorized backend cannot batch
must fall back to sequential, say so in the log, and then agree exactly.

Clients of the digits federation have unequal data sizes and ``chunk_size`` is small, so the
tests also cover several chunks per round, padded partial batches and clients that run out of
steps before others.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
import torch
from torch import nn

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import COMPRESSORS, build_compressor
from fedcomm.models import build_model
from fedcomm.models.vision import MLP
from fedcomm.simulation import loop
from fedcomm.simulation.data import ClientData, FederatedTensors
from fedcomm.simulation.shard import Shard
from tests.conftest import digits_federation

ALL = sorted(CONFIGS)
# configs that reach each algorithm's batched special cases within three rounds
OVERRIDES: dict[str, dict[str, Any]] = {
    "feddst": {"readjust_every": 1},  # mid-training readjustment (after_step) every round
    "fedbiad": {"stage_boundary": 2, "tau": 1},  # stage one resampling, then stage two
    "fedprox": {"mu": 0.1},
    "fedsparse": {"lambda": 0.01},  # the drift term reads the anchor
    "fedavg_laplace": {"lam": 0.01},  # the proximal post-step reads the anchor
    "fedavg_mog": {"components": 3, "init_noise": 0.05},
    "heterofl": {"rate": 0.5, "mask_labels": True},
    "fjord": {"q_max": 0.8},
}
# local configs: plain SGD, and momentum + weight decay + clipping over two epochs
LOCALS = {
    "sgd": LocalConfig(epochs=1, batch_size=16, lr=0.05),
    "momentum": LocalConfig(
        epochs=2, batch_size=8, lr=0.05, momentum=0.5, weight_decay=1e-3, clip_grad_norm=1.0
    ),
}
UNBATCHED = {"progfed", "prunefl"}  # say why in the log, run sequentially
BATCHED = set(ALL) - UNBATCHED


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def _run(
    name: str,
    fed: FederatedTensors,
    backend: str,
    *,
    local: LocalConfig = LOCALS["sgd"],
    compressor: str = "none",
    rounds: int = 3,
    model: nn.Module | None = None,
    sharded: Shard | None = None,
    compile: str = "none",
    **overrides: Any,
) -> loop.RunResult:
    cfg = loop.LoopConfig(
        rounds=rounds,
        clients_per_round=4,
        local=local,
        seed=11,
        backend=backend,
        chunk_size=3,  # two chunks per round: 3 + 1 clients
        compile=compile,
    )
    kw = {**OVERRIDES.get(name, {}), **overrides}
    if model is None:
        torch.manual_seed(0)
        model = build_model(
            "mlp", input_shape=fed.input_shape, num_classes=fed.num_classes, hidden=[16]
        )
    return loop.run(
        cfg,
        build_algorithm(CONFIGS[name](**kw)),
        model,
        fed,
        build_compressor(compressor),
        config_hash="backends",
        sharded=sharded,
    )


def _assert_close(seq: loop.RunResult, vec: loop.RunResult) -> None:
    assert len(seq.state.round_rows) == len(vec.state.round_rows)
    for a, b in zip(seq.state.round_rows, vec.state.round_rows, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            if key.startswith("time/"):
                continue
            va, vb = a[key], b[key]
            if isinstance(va, float) and isinstance(vb, float):
                if math.isnan(va):
                    assert math.isnan(vb), key
                else:
                    assert vb == pytest.approx(va, rel=1e-4, abs=1e-5), (a["round"], key)
            else:
                assert va == vb, (a["round"], key)
    assert seq.ledger.rows == vec.ledger.rows  # bits are counted from the payloads: exact
    assert seq.final_params.keys() == vec.final_params.keys()
    for k in seq.final_params:
        torch.testing.assert_close(vec.final_params[k], seq.final_params[k], rtol=1e-4, atol=1e-5)
    clients_a = [(r["round"], r["client_id"], r["num_examples"]) for r in seq.state.client_rows]
    clients_b = [(r["round"], r["client_id"], r["num_examples"]) for r in vec.state.client_rows]
    assert clients_a == clients_b


@pytest.mark.parametrize("local", sorted(LOCALS))
@pytest.mark.parametrize("name", ALL)
def test_vectorized_matches_sequential(name: str, local: str, fed: FederatedTensors) -> None:
    seq = _run(name, fed, "sequential", local=LOCALS[local])
    vec = _run(name, fed, "vectorized", local=LOCALS[local])
    assert seq.backend == "sequential"
    assert vec.backend == ("vectorized" if name in BATCHED else "sequential")
    _assert_close(seq, vec)


@pytest.mark.parametrize("compressor", sorted(COMPRESSORS))
@pytest.mark.parametrize("name", ["fedavg", "fedbiad"])
def test_vectorized_matches_sequential_with_every_codec(
    name: str, compressor: str, fed: FederatedTensors
) -> None:
    """Codecs encode after local training with the client's generator where the sequential
    run leaves it; the batched training must leave it there too."""
    seq = _run(name, fed, "sequential", compressor=compressor)
    vec = _run(name, fed, "vectorized", compressor=compressor)
    assert vec.backend == "vectorized"
    _assert_close(seq, vec)


def test_unbatched_algorithms_fall_back_and_say_why(
    fed: FederatedTensors, caplog: pytest.LogCaptureFixture
) -> None:
    for name in sorted(UNBATCHED):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="fedcomm.backend"):
            res = _run(name, fed, "vectorized", rounds=1)
        assert res.backend == "sequential"
        lines = [r.getMessage() for r in caplog.records if r.name == "fedcomm.backend"]
        assert len(lines) == 1, lines  # once per run, not per round
        assert f"{name} runs sequentially: " in lines[0]
        assert len(lines[0].split(": ", 1)[1]) > 20  # a reason, not just a name


class _WithBatchNorm(nn.Module):
    def __init__(self, d: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, classes)
        self.bn = nn.BatchNorm1d(classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.fc(x.flatten(1)))


class _WithDropout(MLP):
    """The registry's MLP (so the sub-model family takes it) with dropout on its input and its
    hidden layer: two sites a forward pass."""

    def __init__(self, d: int, classes: int, p: float = 0.3) -> None:
        super().__init__(d, [16], classes)
        self.drop_in = nn.Dropout(p / 2)
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(torch.relu(self.fc1(self.drop_in(x.flatten(1))))))


class _ConvWithDropout(nn.Module):
    """A small CNN with channel dropout (Dropout2d) and element dropout."""

    def __init__(self, shape: tuple[int, ...], classes: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(shape[0], 4, 3, padding=1)
        self.drop2d = nn.Dropout2d(0.25)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(4 * math.prod(shape[1:]), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(self.drop2d(torch.relu(self.conv(x))).flatten(1)))


def _dropout_model(fed: FederatedTensors, p: float = 0.3) -> nn.Module:
    torch.manual_seed(0)
    return _WithDropout(math.prod(fed.input_shape), fed.num_classes, p)


@pytest.mark.parametrize("name", sorted(BATCHED))
def test_dropout_models_batch_and_match_sequential(name: str, fed: FederatedTensors) -> None:
    """Each client's masks come from its own dropout stream, drawn outside the step, so a
    dropout model trains batched with the sequential run's draws (padded batches included)."""
    seq = _run(name, fed, "sequential", model=_dropout_model(fed))
    vec = _run(name, fed, "vectorized", model=_dropout_model(fed))
    assert vec.backend == "vectorized"
    _assert_close(seq, vec)


def test_fedbiad_counter_noise_batches_and_matches_sequential(fed: FederatedTensors) -> None:
    """``noise: counter``: each step's ε computed where the tensors live from (client key, step,
    parameter), no generator: the same draws on both backends, and other draws than the
    generator's (the option changes the run)."""
    seq = _run("fedbiad", fed, "sequential", local=LOCALS["momentum"], noise="counter")
    vec = _run("fedbiad", fed, "vectorized", local=LOCALS["momentum"], noise="counter")
    assert vec.backend == "vectorized"
    _assert_close(seq, vec)
    gen = _run("fedbiad", fed, "sequential", local=LOCALS["momentum"])
    assert not torch.allclose(gen.final_params["fc1.weight"], seq.final_params["fc1.weight"])


@pytest.mark.parametrize("name", ["fedbiad", "feddst"])
def test_a_compiled_batched_step_matches_sequential(name: str, fed: FederatedTensors) -> None:
    """``train.compile``: the vmapped step through torch.compile (``aot_eager``: the capture
    and its graphs, with eager kernels, so a CPU test takes seconds; ``inductor`` and CUDA
    graphs run the same graphs). Padded and unpadded steps, two chunk sizes, hooks, draws."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    seq = _run(name, fed, "sequential", local=LOCALS["momentum"])
    vec = _run(name, fed, "vectorized", local=LOCALS["momentum"], compile="aot_eager")
    assert vec.backend == "vectorized"
    assert counters["stats"]["unique_graphs"] == 4  # (unpadded, padded) x 2 chunk sizes
    assert not counters["graph_break"]  # the whole step is one graph
    _assert_close(seq, vec)


def test_compile_leaves_dropout_models_uncompiled_and_says_so(
    fed: FederatedTensors, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="fedcomm.backend"):
        vec = _run("fedavg", fed, "vectorized", rounds=1, compile="inductor",
                   model=_dropout_model(fed))  # fmt: skip
    assert vec.backend == "vectorized"
    assert any("the batched step runs uncompiled" in r.getMessage() for r in caplog.records)


def test_channel_dropout_batches_and_matches_sequential(fed: FederatedTensors) -> None:
    runs = {}
    for backend in ("sequential", "vectorized"):
        torch.manual_seed(0)
        model = _ConvWithDropout(tuple(fed.input_shape), fed.num_classes)
        runs[backend] = _run("fedavg", fed, backend, local=LOCALS["momentum"], model=model)
    assert runs["vectorized"].backend == "vectorized"
    _assert_close(runs["sequential"], runs["vectorized"])


def test_dropout_draws_are_the_clients_own(fed: FederatedTensors) -> None:
    """The masks come from each client's (seed, DROPOUT, round, client) stream: the global
    generator's state does not change a run; the masks do act (p = 0.3 is not p = 0)."""
    runs = []
    for global_seed in (1, 2):
        model = _dropout_model(fed)
        torch.manual_seed(global_seed)  # the global generator no longer feeds dropout
        runs.append(_run("fedavg", fed, "sequential", model=model))
    a, b = runs
    assert all(torch.equal(a.final_params[k], b.final_params[k]) for k in a.final_params)
    none = _run("fedavg", fed, "sequential", model=_dropout_model(fed, p=0.0))
    assert not torch.allclose(a.final_params["fc1.weight"], none.final_params["fc1.weight"])


class _FunctionalDropout(nn.Module):
    def __init__(self, d: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(nn.functional.dropout(x.flatten(1), 0.2, self.training))


class _AlphaDropout(nn.Module):
    def __init__(self, d: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, classes)
        self.alpha = nn.AlphaDropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.alpha(x.flatten(1)))


@pytest.mark.parametrize(
    ("model", "reason"),
    [
        (_FunctionalDropout, "outside nn.Dropout layers (e.g. F.dropout)"),
        (_AlphaDropout, "alpha dropout layers (alpha)"),
        (_WithBatchNorm, "buffers (bn."),  # running statistics: module state, not per client
    ],
)
def test_a_model_that_cannot_be_batched_falls_back(
    model: type[nn.Module], reason: str, fed: FederatedTensors, caplog: pytest.LogCaptureFixture
) -> None:
    d = math.prod(fed.input_shape)
    with caplog.at_level(logging.WARNING, logger="fedcomm.backend"):
        torch.manual_seed(0)
        res = _run("fedavg", fed, "vectorized", rounds=1, model=model(d, fed.num_classes))
    assert res.backend == "sequential"
    assert any(reason in r.getMessage() for r in caplog.records)


def test_vectorized_is_deterministic_and_chunking_does_not_matter(fed: FederatedTensors) -> None:
    a = _run("fedsparse", fed, "vectorized")
    b = _run("fedsparse", fed, "vectorized")
    assert [
        {k: v for k, v in r.items() if not k.startswith("time/")} for r in a.state.round_rows
    ] == [{k: v for k, v in r.items() if not k.startswith("time/")} for r in b.state.round_rows]
    assert all(torch.equal(a.final_params[k], b.final_params[k]) for k in a.final_params)
    cfg = loop.LoopConfig(
        rounds=2, clients_per_round=4, local=LOCALS["sgd"], seed=11, backend="vectorized",
        chunk_size=1,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_model(
        "mlp", input_shape=fed.input_shape, num_classes=fed.num_classes, hidden=[16]
    )
    one = loop.run(
        cfg, build_algorithm(CONFIGS["fedavg"]()), model, fed, build_compressor("none"),
        config_hash="c",
    )  # fmt: skip
    seq = _run("fedavg", fed, "sequential", rounds=2)
    _assert_close(seq, one)


def _text_federation(output: str, clients: int = 5, T: int = 6, V: int = 24) -> FederatedTensors:
    """Random token windows, unequal client sizes: next-token targets per position (LM) or
    after the window (next-char)."""
    g = torch.Generator().manual_seed(5)

    def client(n: int) -> ClientData:
        x = torch.randint(0, V, (n, T), generator=g)
        shape = (n, T) if output == "sequence" else (n,)
        return ClientData(x, torch.randint(0, V, shape, generator=g))

    train = tuple(client(12 + 5 * i) for i in range(clients))
    test = tuple(client(6) for _ in range(clients))
    return FederatedTensors(train, test, client(20), V, (T,))


@pytest.mark.parametrize("output", ["sequence", "last"])
@pytest.mark.parametrize("name", ["fedavg", "fedprox", "fedbiad", "fedsparse", "fedl1"])
def test_lstm_clients_batch_and_match_sequential(name: str, output: str) -> None:
    """LSTM models (FedBIAD's word LM, LEAF's next-char) run batched on the vectorized backend
    (GateLSTM's gate form) and agree with the sequential run (the fused kernel)."""
    text = _text_federation(output)

    def model() -> nn.Module:
        torch.manual_seed(0)
        return build_model(
            "lstm", input_shape=(6,), num_classes=24, embed_dim=8, hidden=12, output=output
        )

    seq = _run(name, text, "sequential", model=model(), rounds=2)
    vec = _run(name, text, "vectorized", model=model(), rounds=2)
    assert vec.backend == "vectorized"
    _assert_close(seq, vec)


def test_unknown_backend_is_refused(fed: FederatedTensors) -> None:
    with pytest.raises(ValueError, match=r"train.backend: 'gpu' is not one of"):
        _run("fedavg", fed, "gpu", rounds=1)


@pytest.mark.parametrize(
    ("name", "model_name"),
    [
        ("fedavg", "mnist_cnn"),
        ("fedsparse", "mnist_cnn"),  # gates on conv channels
        ("feddrop", "mnist_cnn"),  # dropped conv channels (FedDrop takes no FedDST net)
        ("fedbiad", "mnist_cnn"),  # weight noise on conv weights
        ("fedavg", "feddst_cnn"),
        ("feddst", "feddst_cnn"),  # masks readjusted mid-training
    ],
)
def test_conv_nets_batch_and_match_the_channels_last_sequential_run(
    name: str, model_name: str, fed: FederatedTensors
) -> None:
    """Conv nets: the sequential backend runs them channels-last (oneDNN's layout, max pooling
    before the ReLU), the vectorized one as NCHW grouped convolutions under vmap; the runs agree
    within the same tolerance as the MLP's."""

    def model() -> nn.Module:
        torch.manual_seed(0)
        kw: dict[str, Any] = {
            "channels": [3, 4],
            "hidden": [8] if model_name == "feddst_cnn" else 8,
        }
        digits = (1, 16, 16)  # the 8x8 digits upsampled: room for two 5x5 blocks of either net
        return build_model(model_name, input_shape=digits, num_classes=fed.num_classes, **kw)

    big = _upsampled(fed)
    seq = _run(name, big, "sequential", model=model(), rounds=2)
    vec = _run(name, big, "vectorized", model=model(), rounds=2)
    assert vec.backend == "vectorized"
    _assert_close(seq, vec)


def _upsampled(fed: FederatedTensors) -> FederatedTensors:
    """``fed``'s 8x8 images as 16x16 (bilinear: repeated pixels would tie the max pools)."""

    def up(d: ClientData) -> ClientData:
        x = torch.nn.functional.interpolate(d.x, scale_factor=2, mode="bilinear")
        return ClientData(x, d.y)

    return FederatedTensors(
        tuple(up(d) for d in fed.train),
        tuple(up(d) for d in fed.test),
        up(fed.global_test),
        fed.num_classes,
        (1, 16, 16),
    )


@pytest.mark.parametrize(
    ("name", "overrides"),
    [
        ("fedbiad", {"softmax_rows": "kept"}),  # a softmax over the kept output rows
        ("fedbiad", {"rescale_rows": True}),
        ("feddrop", {"rescale": False}),  # no inverted dropout (on by default)
        ("fedsparse", {"gate_optimizer": "sgd", "gate_lr": 0.1}),
    ],
)
def test_readings_of_issue_41_batch_like_the_sequential_run(
    name: str, overrides: dict[str, Any], fed: FederatedTensors
) -> None:
    seq = _run(name, fed, "sequential", **overrides)
    vec = _run(name, fed, "vectorized", **overrides)
    assert vec.backend == "vectorized"
    _assert_close(seq, vec)
    plain = _run(name, fed, "sequential")  # the reading changes the run
    assert any(
        not torch.equal(plain.final_params[k], seq.final_params[k]) for k in plain.final_params
    )
