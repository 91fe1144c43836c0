"""FedSparse paper (spec §1.9): FedAvg's total traffic, reproduced by the counting code itself.

The paper's "GB" column is GiB (2^30 bytes) of download plus upload (spec §0). FedAvg sends the
whole fp32 model down to each of the 10 clients of a round and each sends the whole model back:

    per round = N params · 32 bits · 2 directions · 10 clients
    total     = rounds · per round / 8 / 2^30 GiB

* CIFAR-10 ``cnn`` (3×32×32, 10 classes): N = 878,538, 1000 rounds
  878,538 · 32 · 2 · 10 · 1000 bits = 878,538 · 8 · 10^4 bytes = 70,283,040,000 B = 65.456 GiB.
* FEMNIST ``cnn`` (1×28×28, 62 classes): N = 608,702, 6000 rounds
  608,702 · 8 · 6·10^4 bytes = 292,176,960,000 B = 272.111 GiB.

Only one round is encoded and recorded; every FedAvg round sends the same messages, so the
total is rounds × that round's bits.
"""

from __future__ import annotations

import pytest

from fedcomm.comm import bits
from fedcomm.comm.codecs import encode_dense
from fedcomm.comm.ledger import Ledger, per_round
from fedcomm.models import build_model

CLIENTS_PER_ROUND = 10


@pytest.mark.parametrize(
    ("input_shape", "num_classes", "num_params", "rounds", "digits", "paper_gib"),
    [
        ((3, 32, 32), 10, 878_538, 1000, 2, 65.46),  # CIFAR-10
        ((1, 28, 28), 62, 608_702, 6000, 1, 272.1),  # FEMNIST
    ],
)
def test_fedavg_total_gib(
    input_shape: tuple[int, int, int],
    num_classes: int,
    num_params: int,
    rounds: int,
    digits: int,
    paper_gib: float,
) -> None:
    model = build_model("cnn", input_shape=input_shape, num_classes=num_classes)
    params = dict(model.named_parameters())
    assert sum(p.numel() for p in params.values()) == num_params

    model_msg = encode_dense(params)  # the same message goes down and comes back up
    ledger = Ledger()
    for client_id in range(CLIENTS_PER_ROUND):
        ledger.record(1, client_id, "down", model_msg)
        ledger.record(1, client_id, "up", model_msg)

    frame = ledger.frame()
    round_bits = int((frame["payload_bits"] + frame["index_bits"] + frame["meta_bits"]).sum())
    assert round_bits == num_params * 32 * 2 * CLIENTS_PER_ROUND  # dense: no index, no meta
    assert round_bits == int(frame["dense_bits"].sum())

    total_gib = bits.to_gib(rounds * round_bits)
    assert round(total_gib, digits) == paper_gib

    summary = per_round(frame)
    assert summary.height == 1
    assert summary["up_bytes"][0] == summary["down_bytes"][0] == num_params * 4 * CLIENTS_PER_ROUND
    assert round(rounds * summary["cum_gib"][0], digits) == paper_gib


def test_ptb_lstm_fedavg_upload_is_29_8_mb() -> None:
    """FedBIAD Table II: the PTB LSTM (embedding 300, 2-layer LSTM 300, linear, vocabulary 10k,
    untied) has 7,454,800 parameters; a dense FedAvg upload = 7,454,800 x 32 bits = 29.82 MB."""
    lstm = build_model("lstm", input_shape=(35,), num_classes=10_000)
    params = {k: p.detach() for k, p in lstm.named_parameters()}
    assert sum(p.numel() for p in params.values()) == 7_454_800
    megabytes = bits.to_bytes(encode_dense(params).nbits().total) / 1e6
    assert round(megabytes, 1) == 29.8
