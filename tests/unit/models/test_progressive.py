"""Staged models and ProgressiveNet (ProgFed, specs/feddst-progfed.md §2(a), 2(c), 2(d))."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from torch.func import functional_call

from fedcomm.models import (
    ProgressiveNet,
    build_model,
    dense_numel,
    is_staged,
    num_parameters,
    structure_for,
)
from fedcomm.models.progressive import TempHead, Unit, even_cuts
from fedcomm.models.vision import MLP

# key -> (model, input_shape, num_classes, options, default stages); small, so the file is fast
STAGED: dict[str, tuple[str, tuple[int, ...], int, dict[str, Any], int]] = {
    "mlp[16]": ("mlp", (1, 6, 6), 5, {"hidden": [16]}, 2),
    "mlp[32,16]": ("mlp", (1, 6, 6), 5, {"hidden": [32, 16]}, 3),
    "cnn": ("cnn", (3, 16, 16), 7, {"channels": [4, 8], "hidden": 16}, 3),
    "mnist_cnn": ("mnist_cnn", (1, 12, 12), 10, {"channels": [4, 8], "hidden": 16}, 3),
    "resnet20": ("resnet20", (3, 8, 8), 10, {}, 3),
    "resnet18": ("resnet18", (3, 4, 4), 10, {}, 4),
    "progfed_emnist_cnn": ("progfed_emnist_cnn", (1, 10, 10), 6, {}, 3),
    "progfed_cifar_cnn": ("progfed_cifar_cnn", (3, 18, 18), 4, {}, 4),
}


def base(key: str, seed: int = 0) -> nn.Module:
    name, shape, classes, options, _ = STAGED[key]
    torch.manual_seed(seed)
    return build_model(name, input_shape=shape, num_classes=classes, **options)


def net_of(key: str, stages: int | None = None, seed: int = 0) -> ProgressiveNet:
    model = base(key)
    stages = STAGED[key][4] if stages is None else stages
    return ProgressiveNet(model, stages, STAGED[key][2], torch.Generator().manual_seed(seed))


def batch(key: str, n: int = 3) -> torch.Tensor:
    return torch.randn(n, *STAGED[key][1], generator=torch.Generator().manual_seed(1))


def all_stages(key: str) -> list[tuple[str, int]]:
    return [(key, s) for s in range(1, STAGED[key][4] + 1)]


# --- sizes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "shape", "classes", "stages", "cuts", "sizes"),
    [
        # ProgFed CIFAR-100 ResNet-18 (GroupNorm), S = 4 (spec §2(c))
        ("resnet18", (3, 32, 32), 100, 4, [3, 5, 7, 9], [156_324, 688_292, 2_800_804, 11_220_132]),
        ("resnet18", (3, 32, 32), 100, 2, [7, 9], [2_800_804, 11_220_132]),
        ("resnet18", (3, 32, 32), 100, 3, [3, 7, 9], [156_324, 2_800_804, 11_220_132]),
        ("resnet18", (3, 32, 32), 100, 1, [9], [11_220_132]),
        ("resnet18", (3, 32, 32), 10, 4, [3, 5, 7, 9], [150_474, 676_682, 2_777_674, 11_173_962]),
        # ProgFed EMNIST ConvNet, S = 3, 62 classes
        ("progfed_emnist_cnn", (1, 28, 28), 62, 3, [1, 2, 3], [2_366, 22_846, 1_206_590]),
        # ProgFed CIFAR-10 ConvNet, S = 4 (the paper's 10-way classifier)
        ("progfed_cifar_cnn", (3, 32, 32), 10, 4, [1, 2, 3, 4], [1_226, 20_042, 56_970, 122_570]),
        ("resnet20", (3, 32, 32), 100, 3, [4, 7, 10], [16_180, 69_428, 278_324]),
    ],
)  # fmt: skip
def test_paper_sizes(
    name: str,
    shape: tuple[int, ...],
    classes: int,
    stages: int,
    cuts: list[int],
    sizes: list[int],
) -> None:
    model = build_model(name, input_shape=shape, num_classes=classes)
    assert num_parameters(model) == sizes[-1]
    net = ProgressiveNet(model, stages, classes, torch.Generator().manual_seed(0))
    assert net.cuts == cuts
    assert [net.submodel_numel(s) for s in range(1, stages + 1)] == sizes
    assert net.dense_numel() == dense_numel(net) == sizes[-1]


def test_resnet18_half_layer_split_and_even_fallback() -> None:
    model = build_model("resnet18", input_shape=(3, 32, 32), num_classes=100)
    assert model.stage_cuts(8) == [2, 3, 4, 5, 6, 7, 8, 9]  # type: ignore[operator]
    assert model.stage_cuts(5) == even_cuts(9, 5) == [2, 4, 6, 8, 9]  # type: ignore[operator]
    units = model.units()  # type: ignore[operator]
    assert [u.name for u in units] == ["stem"] + [
        f"layer{i}.{j}" for i in (1, 2, 3, 4) for j in (0, 1)
    ]
    assert [u.width for u in units] == [64, 64, 64, 128, 128, 256, 256, 512, 512]
    assert units[0].prefixes == ("conv1.", "norm1.")
    names = [n for n, _ in model.named_parameters()]
    assert names[:3] == ["conv1.weight", "norm1.weight", "norm1.bias"]
    assert names[-2:] == ["fc.weight", "fc.bias"]
    assert "layer2.0.shortcut.0.weight" in names and "layer1.0.shortcut.0.weight" not in names


# --- every staged model -----------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(STAGED))
def test_units_compose_to_the_forward(key: str) -> None:
    model, x = base(key).eval(), batch(key)
    assert is_staged(model)
    h = x
    for unit in model.units():  # type: ignore[operator]
        h = unit.forward(h)
        assert h.shape[1] == unit.width, unit.name
    assert torch.equal(model.classify(h), model(x))  # type: ignore[operator]


@pytest.mark.parametrize("key", sorted(STAGED))
def test_every_parameter_belongs_to_exactly_one_unit_or_the_classifier(key: str) -> None:
    model = base(key)
    owners: list[tuple[str, ...]] = [u.prefixes for u in model.units()]  # type: ignore[operator]
    owners.append(model.classifier_prefixes)  # type: ignore[arg-type]
    for name, _ in model.named_parameters():
        assert sum(name.startswith(p) for p in owners) == 1, name
    for prefixes in owners:  # and no unit is empty
        assert any(n.startswith(prefixes) for n, _ in model.named_parameters()), prefixes


@pytest.mark.parametrize("key", sorted(STAGED))
def test_default_stages_and_block_partition(key: str) -> None:
    model = base(key)
    assert model.default_stages == STAGED[key][4]
    net = net_of(key)
    assert net.cuts[-1] == len(model.units())  # type: ignore[operator]
    S = net.stages
    blocks = [n for s in range(1, S + 1) for n in net.block_params(s)]
    dense = blocks + net.head_params(S)
    assert sorted(dense) == sorted(n for n, _ in model.named_parameters())
    assert len(dense) == len(set(dense))
    assert net.submodel_params(S) == [n for n, _ in model.named_parameters()]
    assert len(net.heads) == S - 1
    for s in range(1, S):
        assert net.head_params(s) == [f"heads.{s - 1}.weight", f"heads.{s - 1}.bias"]


@pytest.mark.parametrize(
    ("key", "stage"), [pair for key in sorted(STAGED) for pair in all_stages(key)]
)
def test_stage_view_runs_on_the_submodel_params_only(key: str, stage: int) -> None:
    net = net_of(key).eval()
    x, classes = batch(key), STAGED[key][2]
    names = net.submodel_params(stage)
    params = {n: p.detach().clone() for n, p in net.named_parameters() if n in names}
    view = net.at_stage(stage)
    out = functional_call(view, params, (x,))
    assert out.shape == (3, classes)
    # by hand: units[:c_s], then the stage's head
    h = x
    for unit in net.base.units()[: net.cuts[stage - 1]]:
        h = unit.forward(h)
    expected = net.heads[stage - 1](h) if stage < net.stages else net.base.classify(h)
    assert torch.equal(out, expected)
    # inactive parameters (later blocks, other heads) do not matter
    with torch.no_grad():
        for n, p in net.named_parameters():
            if n not in names:
                p.fill_(float("nan"))
    again = functional_call(view, params, (x,))
    assert torch.isfinite(again).all()
    assert torch.equal(again, out)


@pytest.mark.parametrize("key", sorted(STAGED))
def test_views_share_modules_and_stay_out_of_the_tree(key: str) -> None:
    net = net_of(key)
    names = [n for n, _ in net.named_parameters()]
    assert len(names) == len(set(names))
    assert names[: len(names) - 2 * (net.stages - 1)] == [
        n
        for n, _ in net.base.named_parameters()  # type: ignore[attr-defined]
    ]
    x = batch(key)
    net.eval()
    assert torch.equal(net(x), net.base(x))  # type: ignore[operator]
    assert net.at_stage(net.stages) is net
    for s in range(1, net.stages):
        view = net.at_stage(s)
        assert view is net.at_stage(s)  # cached
        assert [n for n, _ in view.named_parameters()] == names
        assert all(a is b for a, b in zip(view.parameters(), net.parameters(), strict=True))
        assert not any(m is net for m in view.modules())
    n_modules = len(list(net.modules()))
    for s in range(1, net.stages):
        net.at_stage(s)
    assert len(list(net.modules())) == n_modules  # the cache adds nothing to the tree


def test_block_and_head_params() -> None:
    net = net_of("resnet18")
    assert net.block_params(1)[:3] == ["conv1.weight", "norm1.weight", "norm1.bias"]
    assert all(n.startswith(("conv1.", "norm1.", "layer1.")) for n in net.block_params(1))
    assert all(n.startswith("layer3.") for n in net.block_params(3))
    assert net.head_params(4) == ["fc.weight", "fc.bias"]
    assert net.submodel_params(2) == [
        *net.block_params(1),
        *net.block_params(2),
        "heads.1.weight",
        "heads.1.bias",
    ]
    assert [tuple(p.shape) for n, p in net.heads.named_parameters() if n.endswith("weight")] == [
        (10, 64),
        (10, 128),
        (10, 256),
    ]
    mlp = net_of("mlp[16]")  # S = 2: stage 2 adds only the classifier
    assert mlp.cuts == [1, 1]
    assert mlp.block_params(2) == []
    assert mlp.head_params(2) == ["fc2.weight", "fc2.bias"]
    assert mlp.submodel_params(1) == ["fc1.weight", "fc1.bias", "heads.0.weight", "heads.0.bias"]
    assert mlp.submodel_params(2) == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    with pytest.raises(ValueError, match=r"1\.\.2"):
        mlp.at_stage(3)
    with pytest.raises(ValueError, match=r"1\.\.2"):
        mlp.block_params(0)


def test_linear_mlp_has_one_stage() -> None:
    torch.manual_seed(0)
    model = build_model("mlp", input_shape=(2, 3), num_classes=4, hidden=[])
    assert model.default_stages == 1 and model.stage_cuts(1) == [0]  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"1\.\.1"):
        model.stage_cuts(2)  # type: ignore[operator]
    net = ProgressiveNet(model, 1, 4, torch.Generator())
    x = torch.randn(5, 2, 3)
    assert torch.equal(net(x), model(x))
    assert net.submodel_params(1) == ["fc1.weight", "fc1.bias"] and len(net.heads) == 0


# --- heads --------------------------------------------------------------------------------------


def test_temp_head_pools_4d_inputs_only() -> None:
    head = TempHead(3, 2)
    x = torch.randn(4, 3, 5, 5)
    torch.testing.assert_close(head(x), head(x.mean(dim=(2, 3))))
    assert head(torch.randn(4, 3)).shape == (4, 2)


def test_head_init_is_deterministic_from_the_generator_only() -> None:
    model = base("progfed_cifar_cnn")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(123)
    state = torch.get_rng_state()
    a = ProgressiveNet(model, 4, 4, torch.Generator().manual_seed(7))
    assert torch.equal(torch.get_rng_state(), state)  # the global RNG is untouched
    torch.manual_seed(999)  # a different global state gives the same heads
    b = ProgressiveNet(base("progfed_cifar_cnn"), 4, 4, torch.Generator().manual_seed(7))
    c = ProgressiveNet(base("progfed_cifar_cnn"), 4, 4, torch.Generator().manual_seed(8))
    heads = [dict(n.heads.named_parameters()) for n in (a, b, c)]
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])
    assert not torch.equal(heads[0]["0.weight"], heads[2]["0.weight"])
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # base intact


def test_heads_follow_the_base_dtype() -> None:
    model = base("progfed_cifar_cnn").double()
    net = ProgressiveNet(model, 4, 4, torch.Generator())
    assert all(p.dtype == torch.float64 for p in net.parameters())
    x = batch("progfed_cifar_cnn").double()
    assert net.at_stage(2)(x).dtype == torch.float64


# --- stage_of / for_params / helpers -------------------------------------------------------------


def test_stage_of_and_for_params() -> None:
    net = net_of("progfed_cifar_cnn")
    full = dict(net.named_parameters())
    assert net.stage_of({k: full[k] for k in net.submodel_params(4)}) == 4
    assert net.for_params({k: full[k] for k in net.submodel_params(4)}) is net
    for s in (1, 2, 3):
        sub = {k: full[k] for k in net.submodel_params(s)}
        assert net.stage_of(sub) == s
        assert net.for_params(sub) is net.at_stage(s)
        assert structure_for(net, sub) is net.at_stage(s)
    with pytest.raises(ValueError, match="several temporary heads"):
        net.stage_of(
            {"heads.0.weight": full["heads.0.weight"], "heads.2.bias": full["heads.2.bias"]}
        )
    plain = base("cnn")
    assert structure_for(plain, dict(plain.named_parameters())) is plain
    assert dense_numel(plain) == num_parameters(plain)


def test_dense_numel_excludes_heads() -> None:
    net = net_of("resnet20")
    heads = sum(p.numel() for p in net.heads.parameters())
    assert heads == (16 * 10 + 10) + (32 * 10 + 10)  # heads after layer1 and layer2
    assert num_parameters(net) == net.dense_numel() + heads
    assert net.dense_numel() == num_parameters(net.base)  # type: ignore[arg-type]
    assert dense_numel(net) == net.dense_numel()


# --- cuts ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("units", "stages", "cuts"),
    [
        (3, 1, [3]),
        (3, 2, [2, 3]),
        (3, 3, [1, 2, 3]),
        (3, 4, [1, 2, 3, 3]),  # S = U + 1: the last stage adds only the classifier
        (1, 2, [1, 1]),
        (0, 1, [0]),
        (9, 4, [3, 5, 7, 9]),
        (10, 3, [4, 7, 10]),
        (9, 5, [2, 4, 6, 8, 9]),
    ],
)
def test_even_cuts(units: int, stages: int, cuts: list[int]) -> None:
    assert even_cuts(units, stages) == cuts


@pytest.mark.parametrize(("units", "stages"), [(3, 0), (3, 5), (0, 2), (2, -1)])
def test_even_cuts_errors_name_the_allowed_values(units: int, stages: int) -> None:
    with pytest.raises(ValueError, match=rf"1\.\.{units + 1}\b"):
        even_cuts(units, stages)


@pytest.mark.parametrize(
    ("key", "stages", "cuts"),
    [
        ("resnet20", 1, [10]),
        ("resnet20", 2, [7, 10]),
        ("resnet20", 3, [4, 7, 10]),
        ("resnet20", 4, [3, 5, 8, 10]),
        ("resnet18", 1, [9]),
        ("resnet18", 2, [7, 9]),
        ("resnet18", 3, [3, 7, 9]),
        ("resnet18", 4, [3, 5, 7, 9]),
        ("resnet18", 8, [2, 3, 4, 5, 6, 7, 8, 9]),
        ("cnn", 3, [1, 2, 3]),
        ("cnn", 2, [2, 3]),
        ("mlp[32,16]", 2, [1, 2]),
        ("progfed_emnist_cnn", 3, [1, 2, 3]),
        ("progfed_cifar_cnn", 4, [1, 2, 3, 4]),
    ],
)
def test_stage_cuts_tables(key: str, stages: int, cuts: list[int]) -> None:
    assert base(key).stage_cuts(stages) == cuts  # type: ignore[operator]


@pytest.mark.parametrize(("key", "bad", "allowed"), [("resnet18", 11, 10), ("cnn", 0, 4)])
def test_unsupported_stages_are_refused(key: str, bad: int, allowed: int) -> None:
    with pytest.raises(ValueError, match=rf"1\.\.{allowed}\b"):
        base(key).stage_cuts(bad)  # type: ignore[operator]
    with pytest.raises(ValueError, match=rf"1\.\.{allowed}\b"):
        net_of(key, stages=bad)


# --- refusals, dropout, copies --------------------------------------------------------------------


def test_non_staged_models_are_refused() -> None:
    lstm = build_model("lstm", input_shape=(5,), num_classes=7, embed_dim=4, hidden=4)
    assert not is_staged(lstm)
    with pytest.raises(ValueError, match="not a staged model"):
        ProgressiveNet(lstm, 2, 7, torch.Generator())
    assert not is_staged(net_of("cnn"))  # a ProgressiveNet is not itself staged


def test_base_with_its_own_parameters_is_refused() -> None:
    class Scaled(MLP):
        def __init__(self) -> None:
            super().__init__(4, [3], 2)
            self.scale = nn.Parameter(torch.ones(1))

    with pytest.raises(ValueError, match=r"\['scale'\] directly on itself"):
        ProgressiveNet(Scaled(), 2, 2, torch.Generator())


def test_emnist_dropout_is_a_child_module_shared_by_the_views() -> None:
    net = net_of("progfed_emnist_cnn")
    x = batch("progfed_emnist_cnn")
    view = net.at_stage(2)
    view.train()
    assert net.get_submodule("dropout1").training  # the views flip the shared modules
    torch.manual_seed(0)
    a = view(x)
    torch.manual_seed(1)
    assert not torch.equal(a, view(x))  # dropout active
    net.eval()
    assert not view.get_submodule("dropout1").training
    assert torch.equal(view(x), view(x))
    torch.manual_seed(0)
    quiet = build_model("progfed_emnist_cnn", input_shape=(1, 10, 10), num_classes=6, dropout=False)
    quiet.train()
    assert torch.equal(quiet(x), quiet(x))
    assert num_parameters(quiet) == num_parameters(net.base)  # type: ignore[arg-type]


def test_deepcopy_keeps_views_on_the_copy() -> None:
    net = net_of("mnist_cnn").eval()
    x = batch("mnist_cnn")
    view_out = net.at_stage(2)(x)
    twin = copy.deepcopy(net)
    with torch.no_grad():
        for p in twin.parameters():
            p.zero_()
    assert torch.count_nonzero(twin.at_stage(2)(x)) == 0
    assert torch.count_nonzero(twin(x)) == 0
    assert torch.equal(net.at_stage(2)(x), view_out)  # the original is untouched


def test_unit_is_a_frozen_record() -> None:
    unit = Unit("u", ("a.",), 3, torch.relu)
    with pytest.raises(AttributeError):
        unit.width = 4  # type: ignore[misc]
