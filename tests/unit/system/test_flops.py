"""Forward FLOPs per weight (fedcomm.system.flops) where a weight is used twice."""

from __future__ import annotations

import pytest
import torch

from fedcomm.models import build_model
from fedcomm.system.flops import example_flops, forward_flops


def _lstm(tie: bool) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(
        "lstm", input_shape=(5,), num_classes=50, embed_dim=8, hidden=8, num_layers=2,
        tie_weights=tie,
    )  # fmt: skip


def test_a_tied_decoder_is_counted_under_the_shared_weight() -> None:
    """issue 45: named_parameters() lists a tied weight once (as embedding.weight), so the
    decoder's FLOPs, recorded under decoder.weight, were dropped."""
    tokens = torch.randint(0, 50, (1, 5))
    untied, tied = forward_flops(_lstm(False), tokens), forward_flops(_lstm(True), tokens)
    by_hand = 5 * (2 * 2 * 4 * 8 * (8 + 8) + 2 * 8 * 50)  # T x (2 LSTM layers + the decoder)
    assert sum(f for f, _ in untied.values()) == by_hand
    assert sum(f for f, _ in tied.values()) == by_hand
    assert tied["embedding.weight"] == (2 * 8 * 50 * 5, 50 * 8)  # the decoder's product
    trained = dict(_lstm(True).named_parameters())
    assert example_flops(tied, trained, sparse=True) == pytest.approx(3 * by_hand)
