"""The groups/rows interface: layer partitions, norms, sizes and masks."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call

from fedcomm.models import (
    GroupSpec,
    apply_mask,
    build_model,
    expand_mask,
    group_norms,
    group_sizes,
    groups,
    rows,
    ungrouped,
)


def params_of(model: nn.Module) -> dict[str, Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def femnist_cnn() -> nn.Module:
    torch.manual_seed(0)
    return build_model("cnn", input_shape=(1, 28, 28), num_classes=62)


def small_lstm(**options: object) -> nn.Module:
    torch.manual_seed(0)
    opts = {"embed_dim": 6, "hidden": 5, "num_layers": 2, **options}
    return build_model("lstm", input_shape=(4,), num_classes=11, **opts)


def small_models() -> dict[str, nn.Module]:
    torch.manual_seed(0)
    return {
        "mlp": build_model("mlp", input_shape=(1, 6, 6), num_classes=4, hidden=[7, 5]),
        "cnn": build_model(
            "cnn", input_shape=(2, 16, 16), num_classes=3, channels=[3, 4], hidden=6
        ),
        "resnet20": build_model("resnet20", input_shape=(3, 8, 8), num_classes=5),
        "feddst_cnn": build_model(
            "feddst_cnn", input_shape=(2, 14, 14), num_classes=3, channels=[3, 4], hidden=[6]
        ),
        "lstm": small_lstm(),
        "lstm_tied": small_lstm(hidden=6, tie_weights=True),
    }


def coverage(model: nn.Module, specs: list[GroupSpec]) -> dict[str, Tensor]:
    """How many groups hold each scalar of each parameter."""
    counts = {k: torch.zeros_like(v) for k, v in model.named_parameters()}
    for spec in specs:
        for g in range(spec.count):
            for name, axis in spec.members:
                counts[name].select(axis, g).add_(1)
    return counts


def test_cnn_groups() -> None:
    specs = groups(femnist_cnn())
    summary = [(s.name, s.kind, s.count, s.is_output) for s in specs]
    assert summary == [
        ("conv1", "filter", 32, False),
        ("conv2", "filter", 64, False),
        ("fc1", "in_feature", 1024, False),
        ("fc2", "in_feature", 512, True),
    ]
    assert specs[0].members == (("conv1.weight", 0), ("conv1.bias", 0))
    assert specs[2].members == (("fc1.weight", 1),)


def test_group_sizes() -> None:
    model = femnist_cnn()
    sizes = [group_sizes(s, params_of(model)) for s in groups(model)]
    assert [int(s[0]) for s in sizes] == [1 * 25 + 1, 32 * 25 + 1, 512, 62]
    assert [s.shape for s in sizes] == [(32,), (64,), (1024,), (512,)]


@pytest.mark.parametrize("partition", [groups, rows])
def test_group_norms_match_manual_loop(
    partition: Callable[[nn.Module], list[GroupSpec]],
) -> None:
    for model in small_models().values():
        params = params_of(model)
        for spec in partition(model):
            squares = [
                torch.stack([(params[n].select(a, g) ** 2).sum() for n, a in spec.members]).sum()
                for g in range(spec.count)
            ]
            manual = torch.stack(squares).sqrt()  # (count,)
            torch.testing.assert_close(group_norms(params, spec), manual)


def test_group_norms_gradient_is_finite_at_zero() -> None:
    spec = GroupSpec("w", "row", (("w", 0),), 2, False)
    w = torch.tensor([[0.0, 0.0], [3.0, 4.0]], requires_grad=True)
    group_norms({"w": w}, spec).sum().backward()
    assert w.grad is not None
    torch.testing.assert_close(w.grad, torch.tensor([[0.0, 0.0], [0.6, 0.8]]))


def test_masking_an_input_feature_zeroes_one_column() -> None:
    model = femnist_cnn()
    params = params_of(model)
    fc1 = next(s for s in groups(model) if s.name == "fc1")
    mask = torch.ones(fc1.count, dtype=torch.bool)
    mask[3] = False
    out = apply_mask(params, [fc1], {"fc1": mask})
    expected = params["fc1.weight"].clone()
    expected[:, 3] = 0
    assert torch.equal(out["fc1.weight"], expected)
    assert torch.equal(out["fc1.bias"], params["fc1.bias"])  # FC bias is not gated
    assert all(out[k] is params[k] for k in params if k != "fc1.weight")


def test_masking_a_filter_zeroes_weight_slice_and_bias() -> None:
    model = femnist_cnn()
    params = params_of(model)
    before = {k: v.clone() for k, v in params.items()}
    conv2 = groups(model)[1]
    mask = torch.ones(conv2.count)
    mask[5] = 0.0
    out = apply_mask(params, groups(model), {"conv2": mask})
    w, b = before["conv2.weight"].clone(), before["conv2.bias"].clone()
    w[5], b[5] = 0, 0
    assert torch.equal(out["conv2.weight"], w)
    assert torch.equal(out["conv2.bias"], b)
    assert all(torch.equal(params[k], before[k]) for k in params)  # inputs untouched


def test_expand_mask_broadcasts_along_member_axis() -> None:
    model = femnist_cnn()
    params = params_of(model)
    conv1, fc1 = groups(model)[0], groups(model)[2]
    conv_masks = expand_mask(conv1, torch.ones(32, dtype=torch.bool), params)
    assert {k: tuple(v.shape) for k, v in conv_masks.items()} == {
        "conv1.weight": (32, 1, 1, 1),
        "conv1.bias": (32,),
    }
    assert conv_masks["conv1.weight"].dtype == torch.float32
    assert expand_mask(fc1, torch.ones(1024), params)["fc1.weight"].shape == (1, 1024)
    with pytest.raises(ValueError, match=r"expected \(1024,\)"):
        expand_mask(fc1, torch.ones(1023), params)


def test_apply_mask_rejects_unknown_names() -> None:
    model = femnist_cnn()
    with pytest.raises(ValueError, match=r"unknown groups \['fc9'\]"):
        apply_mask(params_of(model), groups(model), {"fc9": torch.ones(3)})


def test_soft_mask_is_differentiable() -> None:
    model = femnist_cnn()
    params = params_of(model)
    fc2 = groups(model)[-1]
    gate = torch.full((fc2.count,), 0.5, requires_grad=True)
    out = apply_mask(params, [fc2], {"fc2": gate})
    out["fc2.weight"].sum().backward()
    assert gate.grad is not None
    torch.testing.assert_close(gate.grad, params["fc2.weight"].sum(0))


@pytest.mark.parametrize("name", ["mlp", "cnn", "feddst_cnn", "resnet20"])
def test_forward_with_all_hidden_groups_masked(name: str) -> None:
    model = small_models()[name]
    specs = groups(model)
    masks = {s.name: torch.zeros(s.count) for s in specs if not s.is_output}
    masked = apply_mask(params_of(model), specs, masks)
    shape = {
        "mlp": (1, 6, 6),
        "cnn": (2, 16, 16),
        "feddst_cnn": (2, 14, 14),
        "resnet20": (3, 8, 8),
    }[name]
    x = torch.randn(2, *shape)
    logits = functional_call(model, masked, (x,))
    assert logits.shape[0] == 2 and torch.isfinite(logits).all()
    if name != "resnet20":  # the first layer's inputs are gated: the output is the bias path
        torch.testing.assert_close(logits[0], logits[1])


@pytest.mark.parametrize("name", ["mlp", "cnn", "feddst_cnn", "resnet20", "lstm", "lstm_tied"])
def test_groups_are_disjoint(name: str) -> None:
    model = small_models()[name]
    assert all(c.max() <= 1 for c in coverage(model, groups(model)).values())


@pytest.mark.parametrize("name", ["mlp", "cnn", "feddst_cnn", "lstm", "lstm_tied"])
def test_rows_cover_every_scalar_once(name: str) -> None:
    model = small_models()[name]
    counts = coverage(model, rows(model))
    assert all(torch.all(c == 1) for c in counts.values()), name


def test_lstm_rows() -> None:
    model = small_lstm()
    summary = [(s.name, s.kind, s.count, s.members, s.is_output) for s in rows(model)]
    assert summary[0] == ("embedding", "row", 6, (("embedding.weight", 1),), False)
    for k in range(2):
        for m in ("ih", "hh"):
            name = f"lstm.weight_{m}_l{k}"
            members = ((name, 0), (f"lstm.bias_{m}_l{k}", 0))
            assert (name, "row", 4 * 5, members, False) in summary
    assert summary[-1] == ("decoder", "row", 11, (("decoder.weight", 0), ("decoder.bias", 0)), True)
    assert len(summary) == 6


def test_tied_decoder_rows_hold_only_the_bias() -> None:
    decoder = rows(small_lstm(hidden=6, tie_weights=True))[-1]
    assert decoder.members == (("decoder.bias", 0),)


def test_lstm_groups_only_gate_the_decoder() -> None:
    model = small_lstm()
    (decoder,) = groups(model)
    assert (decoder.name, decoder.count, decoder.is_output) == ("decoder", 5, True)
    assert ungrouped(params_of(model), [decoder])[0] == "embedding.weight"


def test_resnet_groups_and_ungrouped_norms() -> None:
    model = small_models()["resnet20"]
    specs = groups(model)
    assert [s.is_output for s in specs].count(True) == 1 and specs[-1].name == "fc"
    assert specs[0].members == (("conv1.weight", 0),)  # convs have no bias
    assert "layer2.0.shortcut.0" in {s.name for s in specs}  # option-B projection
    left = ungrouped(params_of(model), specs)
    assert "fc.bias" in left and all("norm" in k or "shortcut.1" in k for k in left[:-1])


def test_cnn_ungrouped_are_the_fc_biases() -> None:
    model = femnist_cnn()
    assert ungrouped(params_of(model), groups(model)) == ("fc1.bias", "fc2.bias")
    assert ungrouped(params_of(model), rows(model)) == ()
