"""Pieces of the vectorized backend: chunking, padding, the batchability probe, allocator."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch import nn

from fedcomm.algorithms.core import ClientData
from fedcomm.algorithms.core import jobs as _jobs
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.core import sequential as _sequential
from fedcomm.models import build_model
from fedcomm.simulation import allocator, vectorized
from fedcomm.simulation.backends import model_unbatched_reason
from fedcomm.simulation.data import FederatedTensors


class _LastStep(torch.nn.Module):
    def __init__(self, rnn: torch.nn.LSTM) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


def _fed(x: torch.Tensor, y: torch.Tensor) -> FederatedTensors:
    d = ClientData(x, y)
    return FederatedTensors((d,), (d,), d, 10, tuple(x.shape[1:]))


def test_chunks_sort_by_steps_and_balance_sizes() -> None:
    steps = [5, 1, 3, 1, 2, 4, 6]
    out = vectorized.chunks(range(7), steps, chunk_size=3)
    assert [len(c) for c in out] == [3, 3, 1]  # ceil(7/3) = 3 chunks of at most 3
    assert [steps[i] for c in out for i in c] == sorted(steps)
    assert vectorized.chunks(range(4), [1] * 4, chunk_size=3) == [[0, 1], [2, 3]]
    assert vectorized.chunks([], [], chunk_size=8) == []


def test_weighted_cross_entropy_of_a_padded_batch_is_the_mean_of_the_real_rows() -> None:
    torch.manual_seed(0)
    logits, y = torch.randn(5, 4), torch.randint(0, 4, (5,))
    w = torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0, 0.0])
    torch.testing.assert_close(
        _jobs.weighted_cross_entropy(logits, y, w), _local.cross_entropy(logits[:3], y[:3])
    )
    seq_logits, seq_y = torch.randn(3, 7, 4), torch.randint(0, 4, (3, 7))  # (B, T, V) tokens
    w = torch.tensor([0.5, 0.5, 0.0])
    torch.testing.assert_close(
        _jobs.weighted_cross_entropy(seq_logits, seq_y, w),
        _local.cross_entropy(seq_logits[:2], seq_y[:2]),
    )


def test_batches_pad_short_clients_with_zero_weight() -> None:
    def job(n: int, batches: list[torch.Tensor]) -> _jobs.LocalJob:
        data = ClientData(
            torch.arange(n, dtype=torch.float32).reshape(n, 1) + 100 * n, torch.zeros(n)
        )
        return _jobs.new_job(
            _jobs.LocalProgram(),
            {},
            data,
            _local.LocalConfig(),
            batches,
            lambda r: None,  # type: ignore[arg-type, return-value]
        )

    chunk = [
        job(3, [torch.tensor([2, 0, 1]), torch.tensor([0, 1])]),
        job(2, [torch.tensor([1])]),  # one step: a no-op (all padding) at step 1
    ]
    batches = vectorized._Batches(chunk, 2)
    xb, yb, wb = batches.step(0)
    assert xb.shape == (2, 3, 1) and yb.shape == (2, 3)
    assert xb[0, :, 0].tolist() == [302, 300, 301]
    assert xb[1, 0, 0].item() == 201  # the second client's own row 1
    assert wb is not None
    torch.testing.assert_close(wb, torch.tensor([[1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0]]))
    xb, _, wb = batches.step(1)
    assert xb.shape == (2, 2, 1) and xb[0, :, 0].tolist() == [300, 301]
    assert wb is not None
    torch.testing.assert_close(wb, torch.tensor([[0.5, 0.5], [0.0, 0.0]]))


def test_batches_of_equal_clients_are_unweighted() -> None:
    data = ClientData(torch.arange(4, dtype=torch.float32).reshape(4, 1), torch.zeros(4))
    jobs = [
        _jobs.new_job(
            _jobs.LocalProgram(), {}, data, _local.LocalConfig(), [torch.tensor([3, 1])],
            lambda r: None,  # type: ignore[arg-type, return-value]
        )
        for _ in range(2)
    ]  # fmt: skip
    xb, _, wb = vectorized._Batches(jobs, 1).step(0)
    assert wb is None and xb[:, :, 0].tolist() == [[3, 1], [3, 1]]  # each its own rows


class _Dropout(nn.Module):
    def __init__(self, functional: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(784, 10)
        self.drop = nn.Dropout(0.5)
        self.functional = functional

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.functional:  # a draw no given mask replaces
            return nn.functional.dropout(self.fc(x.flatten(1)), 0.5, self.training)
        return self.drop(self.fc(x.flatten(1)))


def test_probe_accepts_plain_models_and_names_what_it_refuses() -> None:
    images = _fed(torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,)))
    local = _local.LocalConfig()
    for name, kw in [("mlp", {"hidden": [8]}), ("cnn", {}), ("resnet20", {})]:
        model = build_model(name, input_shape=(1, 28, 28), num_classes=10, **kw)
        assert model_unbatched_reason(model, images, local) is None, name
    assert model_unbatched_reason(_Dropout(), images, local) is None  # masks given per client
    reason = model_unbatched_reason(_Dropout(functional=True), images, local)
    assert reason is not None and "outside nn.Dropout layers (e.g. F.dropout)" in reason
    text = _fed(torch.randint(0, 80, (4, 12)), torch.randint(0, 80, (4, 12)))
    lstm = build_model("lstm", input_shape=(12,), num_classes=80)
    assert model_unbatched_reason(lstm, text, local) is None  # GateLSTM's gate form batches
    fused = torch.nn.Sequential(
        torch.nn.Embedding(80, 8), _LastStep(torch.nn.LSTM(8, 80, batch_first=True))
    )
    reason = model_unbatched_reason(fused, text, local)  # a plain nn.LSTM does not
    assert reason is not None and "no batching rule" in reason and "rnn" in reason


@pytest.mark.parametrize(("env", "expected"), [("1", "True"), ("0", "False")])
def test_allocator_tuning_applies_on_linux_unless_turned_off(env: str, expected: str) -> None:
    code = "from fedcomm.simulation import allocator; print(allocator.tune(), allocator.tune())"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, allocator.ENV: env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    if sys.platform.startswith("linux"):
        assert out == [expected, expected]  # decided once per process
    else:
        assert out == ["False", "False"]


def test_sequential_executor_matches_local_sgd_on_a_tied_model() -> None:
    """The bound fast path (leaves bound into the model once per job) must tie weights as
    ``functional_call`` does: a tied LSTM decoder reads the trained embedding."""
    from fedcomm.models.lstm import LSTMLanguageModel

    torch.manual_seed(0)
    model = LSTMLanguageModel(
        20, embed_dim=8, hidden=8, num_layers=1, tie_weights=True, output="sequence"
    )
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    data = ClientData(torch.randint(0, 20, (16, 5)), torch.randint(0, 20, (16, 5)))
    cfg = _local.LocalConfig(batch_size=4, lr=0.5)
    batches = _local.batch_schedule(16, cfg, torch.Generator().manual_seed(1))
    job = _jobs.new_job(_jobs.LocalProgram(), params, data, cfg, batches, lambda r: r)  # type: ignore[arg-type, return-value]
    ours = _sequential.train_job(job, model, cfg)
    ref = _local.local_sgd(model, params, data, cfg, torch.Generator().manual_seed(1))
    for k in params:
        torch.testing.assert_close(ours.live[k], ref.params[k], rtol=0, atol=1e-6)
    assert ours.loss == pytest.approx(ref.loss, rel=1e-6)
    assert all(torch.equal(v, params[k]) for k, v in model.named_parameters())  # restored
    assert not any(v.requires_grad for v in ours.live.values())


def test_batches_of_equal_sizes_take_each_clients_own_rows_at_every_step() -> None:
    """The no-padding path (every client's s-th batch of one size), partial last batch too."""

    def job(n: int, batches: list[torch.Tensor]) -> _jobs.LocalJob:
        data = ClientData(
            torch.arange(n, dtype=torch.float32).reshape(n, 1) + 100 * n, torch.zeros(n)
        )
        return _jobs.new_job(
            _jobs.LocalProgram(), {}, data, _local.LocalConfig(), batches,
            lambda r: None,  # type: ignore[arg-type, return-value]
        )  # fmt: skip

    chunk = [
        job(3, [torch.tensor([2, 0]), torch.tensor([1])]),
        job(4, [torch.tensor([3, 1]), torch.tensor([0])]),  # (row 2 unused)
    ]
    batches = vectorized._Batches(chunk, 2)
    xb, _, wb = batches.step(0)
    assert wb is None and xb[:, :, 0].tolist() == [[302, 300], [403, 401]]
    xb, _, wb = batches.step(1)
    assert wb is None and xb[:, :, 0].tolist() == [[301], [400]]
