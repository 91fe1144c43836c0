"""``train.device``, ``train.precision`` and ``chunk_size: auto`` over the whole registry.

This machine has no GPU, so the first test checks the property a GPU run needs in a way the
CPU can fail: *every tensor a run creates is placed explicitly*. It trains with
``train.device: cpu`` while torch's default device is ``meta``; a tensor built without a device
(``torch.zeros(n)``, a draw without ``device=``) lands on ``meta`` and the run fails (mixing
devices, or reading a value that ``meta`` does not hold). The run must instead give exactly the
numbers, the bits and the model of the same run without that default. On a CUDA machine,
``test_cuda_run_matches_cpu`` runs the registry on the GPU itself.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn

from fedcomm.algorithms import CONFIGS, build_algorithm
from fedcomm.comm.codecs import build_compressor
from fedcomm.models import build_model
from fedcomm.simulation import device, local_eval, loop, vectorized
from fedcomm.simulation.data import FederatedTensors
from tests.conftest import digits_federation
from tests.contract.test_backends import LOCALS, OVERRIDES, _text_federation

ALL = sorted(CONFIGS)


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


@contextmanager
def default_device(name: str) -> Iterator[None]:
    torch.set_default_device(name)
    try:
        yield
    finally:
        torch.set_default_device(None)


def mlp(fed: FederatedTensors) -> nn.Module:
    torch.manual_seed(0)
    return build_model("mlp", input_shape=fed.input_shape, num_classes=fed.num_classes, hidden=[16])


def run(
    name: str,
    fed: FederatedTensors,
    model: nn.Module,
    *,
    backend: str = "sequential",
    rounds: int = 2,
    compressor: str = "none",
    **train: Any,
) -> loop.RunResult:
    cfg = loop.LoopConfig(
        rounds=rounds,
        clients_per_round=4,
        local=train.pop("local", LOCALS["sgd"]),
        seed=11,
        backend=backend,
        chunk_size=train.pop("chunk_size", 3),
        **train,
    )
    return loop.run(
        cfg,
        build_algorithm(CONFIGS[name](**OVERRIDES.get(name, {}))),
        model,
        fed,
        build_compressor(compressor),
        config_hash="device",
    )


def assert_same(a: loop.RunResult, b: loop.RunResult) -> None:
    """Equal to the bit: metrics (timings aside), the ledger, the final model."""
    for ra, rb in zip(a.state.round_rows, b.state.round_rows, strict=True):
        for key in ra:
            if key.startswith("time/"):
                continue
            va, vb = ra[key], rb[key]
            same = va == vb or (isinstance(va, float) and math.isnan(va) and math.isnan(vb))
            assert same, (ra["round"], key, va, vb)
    assert a.ledger.rows == b.ledger.rows
    assert a.final_params.keys() == b.final_params.keys()
    for k in a.final_params:
        assert torch.equal(a.final_params[k].cpu(), b.final_params[k].cpu()), k


@pytest.mark.parametrize("backend", ["sequential", "vectorized"])
@pytest.mark.parametrize("name", ALL)
def test_every_tensor_is_placed_on_the_run_device(
    name: str, backend: str, fed: FederatedTensors
) -> None:
    plain = run(name, fed, mlp(fed), backend=backend, device="cpu")
    model = mlp(fed)  # (built on the CPU, as the train stage builds it)
    with default_device("meta"):  # anything built without a device lands here and fails
        placed = run(name, fed, model, backend=backend, device="cpu")
    assert_same(plain, placed)


@pytest.mark.parametrize("name", ["fedavg", "fedbiad", "fedsparse"])
def test_lstm_tensors_are_placed_on_the_run_device(name: str) -> None:
    text = _text_federation("sequence")

    def lstm() -> nn.Module:
        torch.manual_seed(0)
        return build_model(
            "lstm", input_shape=(6,), num_classes=24, embed_dim=8, hidden=12, output="sequence"
        )

    plain = run(name, text, lstm(), backend="vectorized", device="cpu")
    model = lstm()
    with default_device("meta"):
        placed = run(name, text, model, backend="vectorized", device="cpu")
    assert_same(plain, placed)


def test_returned_tensors_live_on_the_run_device(fed: FederatedTensors) -> None:
    res = run("fedavg", fed, mlp(fed), device="cpu")
    assert {t.device.type for t in res.final_params.values()} == {"cpu"}


# --- train.device at the boundary -------------------------------------------------------------


def test_auto_is_cuda_when_present_else_cpu() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.resolve("auto").type == expected
    assert device.resolve("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_a_missing_cuda_device_is_named_with_what_is_allowed(name: str) -> None:
    with pytest.raises(device.DeviceError) as err:
        device.resolve(name)
    text = str(err.value)
    assert text.startswith(f"train.device: {name!r} is not available")
    assert "allowed here: ['auto', 'cpu'" in text


@pytest.mark.skipif(device._mps_available(), reason="this machine has MPS")
def test_a_missing_mps_device_is_named() -> None:
    with pytest.raises(device.DeviceError, match=r"'mps' is not available \(this machine has no"):
        device.resolve("mps")


def test_the_loop_refuses_a_missing_device_before_any_work(fed: FederatedTensors) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model = mlp(fed)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(device.DeviceError, match=r"train\.device: 'cuda'"):
        run("fedavg", fed, model, device="cuda")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# --- train.precision ----------------------------------------------------------------------------


def test_bf16_autocast_trains_reproducibly_and_charges_the_same_bits(
    fed: FederatedTensors,
) -> None:
    fp32 = run("fedavg", fed, mlp(fed), rounds=3, device="cpu")
    bf16 = run("fedavg", fed, mlp(fed), rounds=3, device="cpu", precision="bf16")
    again = run("fedavg", fed, mlp(fed), rounds=3, device="cpu", precision="bf16")
    assert_same(bf16, again)  # the same seed on the same device: the same numbers
    assert bf16.ledger.rows == fp32.ledger.rows  # dense payloads: bits depend on shapes only
    # the local matmuls ran in bf16 (the model differs) but parameters stay fp32
    assert all(t.dtype == torch.float32 for t in bf16.final_params.values())
    assert any(
        not torch.equal(bf16.final_params[k], fp32.final_params[k]) for k in fp32.final_params
    )
    last_fp32 = fp32.state.round_rows[-1]["global/accuracy"]
    last_bf16 = bf16.state.round_rows[-1]["global/accuracy"]
    assert last_bf16 == pytest.approx(last_fp32, abs=0.1)


@pytest.mark.parametrize("backend", ["sequential", "vectorized"])
def test_autocast_covers_local_training_only(
    backend: str, fed: FederatedTensors, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Evaluation (global and each client's upload) runs outside autocast: fp32 numbers."""
    seen: list[bool] = []
    real = local_eval.evaluate

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.is_autocast_enabled("cpu"))
        return real(*args, **kwargs)

    monkeypatch.setattr(local_eval, "evaluate", spy)
    run("fedavg", fed, mlp(fed), backend=backend, device="cpu", precision="bf16")
    assert seen and not any(seen)


# --- chunk_size: auto ---------------------------------------------------------------------------


def _job(fed: FederatedTensors, model: nn.Module) -> Any:
    from fedcomm.algorithms.core import jobs as _jobs
    from fedcomm.algorithms.core.local import batch_schedule
    from fedcomm.seeding import Stream, torch_generator

    start = {k: v.detach() for k, v in model.named_parameters()}
    data = fed.train[0]
    batches = batch_schedule(data.num_examples, LOCALS["sgd"], torch_generator(0, Stream.CLIENT))
    return _jobs.new_job(
        _jobs.LocalProgram(), start, data, LOCALS["sgd"], batches, _jobs.unfinished
    )


def test_auto_chunk_size_follows_the_free_memory(fed: FederatedTensors) -> None:
    model = mlp(fed)
    job = _job(fed, model)
    per_client = vectorized.step_bytes(job, model, LOCALS["sgd"])
    params = sum(p.numel() * 4 for p in model.parameters())
    assert per_client > params  # activations and gradients, at least one copy of the weights
    sizes = [
        vectorized.auto_chunk_size(job, model, LOCALS["sgd"], free=f)
        for f in (0, 10 * per_client, 1000 * per_client, 10**12)
    ]
    assert sizes[0] == 1  # never zero, even with no free memory
    assert sizes == sorted(sizes) and sizes[-1] > sizes[1] > 1


@pytest.mark.parametrize("name", ["fedavg", "fedsparse", "fedbiad"])
def test_auto_chunk_size_trains_as_fixed_chunks_do(name: str, fed: FederatedTensors) -> None:
    fixed = run(name, fed, mlp(fed), backend="vectorized", device="cpu", chunk_size=4)
    auto = run(name, fed, mlp(fed), backend="vectorized", device="cpu", chunk_size="auto")
    assert auto.ledger.rows == fixed.ledger.rows
    for k in fixed.final_params:
        torch.testing.assert_close(
            auto.final_params[k], fixed.final_params[k], rtol=1e-5, atol=1e-6
        )


# --- on a real GPU (skipped on this project's CPU machines) -------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["sequential", "vectorized"])
@pytest.mark.parametrize("name", ALL)
def test_cuda_run_matches_cpu(name: str, backend: str, fed: FederatedTensors) -> None:
    """On the GPU every algorithm runs; draws (and so dense and mask bits) are the CPU's."""
    cpu = run(name, fed, mlp(fed), backend=backend, device="cpu")
    gpu = run(name, fed, mlp(fed), backend=backend, device="cuda")
    assert {t.device.type for t in gpu.final_params.values()} == {"cuda"}
    assert [r[:3] for r in gpu.ledger.rows] == [r[:3] for r in cpu.ledger.rows]
    for k in cpu.final_params:
        torch.testing.assert_close(
            gpu.final_params[k].cpu(), cpu.final_params[k], rtol=1e-3, atol=1e-4
        )
