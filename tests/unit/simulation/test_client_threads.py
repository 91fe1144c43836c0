"""``client_threads``: the sequential backend's intra-op threads from a local batch's FLOPs (one
thread for the MLP's small batches, the process's for a CNN's), and no FLOP count at all when
the process has one thread (nothing to choose; the count's first use costs about a second)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from fedcomm.algorithms.core.context import ClientData
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.models import build_model
from fedcomm.simulation import backends
from fedcomm.simulation.data import FederatedTensors


def _federation(shape: tuple[int, ...]) -> FederatedTensors:
    g = torch.Generator().manual_seed(0)
    empty = ClientData(torch.zeros(0, *shape), torch.zeros(0, dtype=torch.long))
    full = ClientData(torch.randn(4, *shape, generator=g), torch.zeros(4, dtype=torch.long))
    return FederatedTensors((empty, full), (full, full), full, 10, shape)


@pytest.fixture
def threads() -> Iterator[Any]:
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    ("name", "shape", "batch", "expected"),
    [
        ("mlp", (1, 28, 28), 10, 1),  # 2 MFLOP a batch
        ("cnn", (3, 32, 32), 32, 2),  # the LeNet-like CNN: 270 MFLOP a batch
    ],
)
def test_threads_follow_a_local_batchs_flops(
    threads: Any, name: str, shape: tuple[int, ...], batch: int, expected: int
) -> None:
    threads(2)
    model = build_model(name, input_shape=shape, num_classes=10)
    local = LocalConfig(epochs=1, batch_size=batch, lr=0.1)
    assert backends.client_threads(model, _federation(shape), local) == expected
    assert model.training  # (counted in eval mode, handed back as it came)


def test_one_thread_is_kept_without_counting(threads: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    threads(1)

    def no_count(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("FLOPs counted in a one-thread process")

    monkeypatch.setattr(backends, "FlopCounterMode", no_count)
    model = build_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    local = LocalConfig(epochs=1, batch_size=32, lr=0.1)
    assert backends.client_threads(model, _federation((3, 32, 32)), local) == 1
