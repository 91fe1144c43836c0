"""Given dropout masks: the sites a forward pass runs, the draws, and the layers' rule."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedcomm.models import dropout


class _Net(nn.Module):
    """Element dropout on the input, channel dropout after the conv, the input dropout again."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.drop2d = nn.Dropout2d(0.25)
        self.fc = nn.Linear(3 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop2d(self.conv(self.drop(x)))  # (B, 3, 4, 4)
        return self.fc(self.drop(h.flatten(1)))


def test_sites_are_the_calls_in_forward_order_with_example_shapes() -> None:
    net = _Net()
    plan = dropout.sites(net, torch.randn(7, 2, 4, 4))
    assert plan == (
        dropout.Site("drop", 0.5, (2, 4, 4)),
        dropout.Site("drop2d", 0.25, (3, 1, 1)),  # one draw per channel
        dropout.Site("drop", 0.5, (48,)),  # called twice: two sites
    )
    assert net.training  # probed in eval mode, the mode given back
    assert dropout.sites(nn.Linear(3, 2), torch.randn(1, 3)) == ()


def test_draws_replay_from_the_generator_and_keep_one_minus_p() -> None:
    plan = (dropout.Site("a", 0.3, (100,)), dropout.Site("b", 0.0, (4,)))
    a = dropout.draw(plan, 1000, torch.Generator().manual_seed(5))
    b = dropout.draw(plan, 1000, torch.Generator().manual_seed(5))
    assert a.keys() == {"dropout::0", "dropout::1"}
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["dropout::0"].shape == (1000, 100) and a["dropout::0"].dtype == torch.bool
    kept = a["dropout::0"].float().mean().item()
    assert kept == pytest.approx(0.7, abs=0.01)  # 100,000 Bernoulli(0.7): sd 0.0015
    assert bool(a["dropout::1"].all())
    c = dropout.draw(plan, 1000, torch.Generator().manual_seed(6))
    assert not torch.equal(a["dropout::0"], c["dropout::0"])


def test_p_zero_and_one_draw_nothing() -> None:
    gen = torch.Generator().manual_seed(1)
    before = gen.get_state()
    plan = (dropout.Site("a", 0.0, (3,)), dropout.Site("b", 1.0, (3,)))
    out = dropout.draw(plan, 2, gen)
    assert torch.equal(gen.get_state(), before)
    assert bool(out["dropout::0"].all()) and not bool(out["dropout::1"].any())


def test_given_masks_scale_by_one_over_keep_and_replace_the_draws() -> None:
    torch.manual_seed(0)
    net = _Net()
    x = torch.randn(3, 2, 4, 4)
    plan = dropout.sites(net, x)
    masks = dropout.draw(plan, 3, torch.Generator().manual_seed(2))
    with dropout.given(net, masks):
        out = net(x)
    h = net.conv(x * masks["dropout::0"] / 0.5) * masks["dropout::1"] / 0.75
    expect = net.fc(h.flatten(1) * masks["dropout::2"] / 0.5)
    torch.testing.assert_close(out, expect)
    assert "forward" not in vars(net.drop)  # the layers are themselves again
    torch.manual_seed(1)
    a = net(x)
    torch.manual_seed(2)
    assert not torch.equal(a, net(x))  # outside: the global generator's draws again


def test_given_masks_in_eval_mode_do_nothing() -> None:
    net = _Net().eval()
    x = torch.randn(2, 2, 4, 4)
    masks = dropout.kept_all(dropout.sites(net, x), 2)
    masks = {k: torch.zeros_like(v) for k, v in masks.items()}  # would drop everything
    with dropout.given(net, masks):
        torch.testing.assert_close(net(x), net.fc(net.conv(x).flatten(1)))


def test_a_forward_that_runs_more_dropout_than_probed_says_so() -> None:
    net = _Net()
    x = torch.randn(2, 2, 4, 4)
    masks = dropout.kept_all(dropout.sites(net, x)[:2], 2)
    with (
        pytest.raises(RuntimeError, match="'drop' ran more often than the masks given"),
        dropout.given(net, masks),
    ):
        net(x)


def test_split_takes_the_masks_out_of_the_frozen_tensors() -> None:
    frozen = {"anchor": torch.ones(2), "dropout::0": torch.ones(2, dtype=torch.bool)}
    masks, rest = dropout.split(frozen)
    assert list(masks) == ["dropout::0"] and list(rest) == ["anchor"]


def test_disabled_turns_off_only_the_dropout_layers() -> None:
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.9), nn.AlphaDropout(0.5), nn.BatchNorm1d(4))
    x = torch.randn(8, 4)
    with dropout.disabled(net):
        assert [m.training for m in net] == [True, False, False, True]
        torch.testing.assert_close(net[2](net[1](x)), x)  # kept everything, drew nothing
    assert all(m.training for m in net)
    assert dropout.unsupported(net) == "its alpha dropout layers (2) have no given-mask rule"
