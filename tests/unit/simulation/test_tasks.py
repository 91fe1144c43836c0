"""The round loop on the real offline datasets and every task shape: FEMNIST writers
(natural_id, CNN), Shakespeare next-character (LSTM, last step) and next-word (LSTM, sequence,
top-3), MNIST shards, and Synthetic(alpha, beta)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from fedcomm.algorithms import build_algorithm, fedavg
from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.codecs import build_compressor
from fedcomm.data.datasets.registry import load_dataset
from fedcomm.data.federated import PartitionSpec, make_partition
from fedcomm.models import build_model
from fedcomm.simulation import loop
from fedcomm.simulation.data import FederatedTensors


def _run(
    ds: Any, spec: PartitionSpec, model: str, *, topk: int = 1, steps: int = 3, **model_kw: Any
) -> loop.RunResult:
    part = make_partition(ds, spec)
    fed = FederatedTensors.build(ds, part.train, part.test)
    torch.manual_seed(0)
    net = build_model(model, input_shape=fed.input_shape, num_classes=fed.num_classes, **model_kw)
    cfg = loop.LoopConfig(
        rounds=2,
        clients_per_round=2,
        local=LocalConfig(steps=steps, batch_size=8, lr=0.1),
        seed=0,
        topk=topk,
    )
    alg = build_algorithm(fedavg.Config())
    return loop.run(cfg, alg, net, fed, build_compressor("none"), config_hash="t")


def _check(res: loop.RunResult, topk: bool = False) -> None:
    last = res.state.round_rows[-1]
    assert 0.0 <= last["global/accuracy"] <= 1.0
    assert last["local/coverage"] > 0
    assert last["comm/cum_gib"] > 0
    if topk:
        assert last["topk/accuracy"] >= last["global/accuracy"]


def test_femnist_writers_cnn(data_root: Path) -> None:
    ds = load_dataset("femnist", data_root)
    res = _run(ds, PartitionSpec("natural_id", 4, {}, 0.2, 0), "cnn")
    _check(res)
    # 608,702 fp32 parameters each way per client: 2 clients x 2 rounds x 2 directions
    assert res.ledger.frame()["payload_bits"].sum() == 8 * 608_702 * 32


def test_shakespeare_next_char_lstm(data_root: Path) -> None:
    ds = load_dataset("shakespeare", data_root, target="next_char", max_roles=6)
    spec = PartitionSpec("natural_id", None, {}, 0.2, 0)
    _check(_run(ds, spec, "lstm", embed_dim=8, hidden=16, num_layers=1, output="last"))


def test_shakespeare_next_word_top3(data_root: Path) -> None:
    ds = load_dataset(
        "shakespeare", data_root, target="next_word", max_roles=6, vocab_size=500, seq_len=10
    )
    spec = PartitionSpec("natural_id", None, {}, 0.2, 0)
    _check(_run(ds, spec, "lstm", topk=3, embed_dim=8, hidden=16, num_layers=1), topk=True)


def test_ptb_iid_next_word(data_root: Path) -> None:
    ds = load_dataset("ptb", data_root, seq_len=20)  # the full PTB: 54,287 windows
    # The task shape needs a slice: the whole corpus's global test set costs about a minute per
    # evaluation of a 10,000-word softmax on 2 cores (before ptb.train.txt it had 7,808 windows).
    ds = dataclasses.replace(ds, x=ds.x[:4000], y=ds.y[:4000])
    spec = PartitionSpec("iid", 5, {}, 0.2, 0)
    _check(_run(ds, spec, "lstm", topk=3, embed_dim=8, hidden=16, num_layers=1), topk=True)


def test_mnist_shards(data_root: Path) -> None:
    ds = load_dataset("mnist", data_root)
    spec = PartitionSpec("shard", 50, {"num_shards_per_partition": 2}, 0.2, 0)
    _check(_run(ds, spec, "mlp", hidden=[32]))


@pytest.mark.parametrize(("alpha", "beta"), [(0.0, 0.0), (1.0, 1.0)])
def test_synthetic(alpha: float, beta: float) -> None:
    ds = load_dataset("synthetic", None, alpha=alpha, beta=beta, num_users=6)
    _check(_run(ds, PartitionSpec("natural_id", None, {}, 0.2, 0), "mlp", hidden=[16]))
