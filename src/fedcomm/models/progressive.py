"""Progressive (stage-wise) views of a model, for ProgFed (Section 3.1 and Algorithm 1).

Wang et al., "ProgFed: Effective, Communication, and Computation Efficient Federated Learning
by Progressive Training", ICML 2022, eq. 1–2: the model is ``M = G_S ∘ E_S ∘ … ∘ E_1`` and the
sub-model of stage ``s`` is ``M^s = G_s ∘ E_s ∘ … ∘ E_1``. For ``s < S`` the temporary head
``G_s`` is global average pooling followed by one linear layer; ``G_S`` is the model's own
classifier.

A *staged* model (:class:`Staged`) lists its feature **units** in forward order (a unit is the
smallest piece a stage can hold: a layer with its activation / pooling, or a residual block),
its classifier, and how ``S`` stages group the units (``stage_cuts``). :class:`ProgressiveNet`
wraps such a model: it adopts the model's child modules under the same names (so the parameter
names are the model's own), adds the ``S − 1`` temporary heads as ``heads.0 … heads.{S-2}``,
and hands out one module per stage whose forward is ``M^s``. Every view shares the same child
modules, so ``torch.func.functional_call(net.at_stage(s), params, (x,))`` works with the
ProgressiveNet's parameter names, and only the sub-model's parameters need to be in ``params``.

Example:
    >>> import torch
    >>> from fedcomm.models import build_model
    >>> base = build_model("progfed_cifar_cnn", input_shape=(3, 32, 32), num_classes=10)
    >>> net = ProgressiveNet(base, 4, 10, torch.Generator().manual_seed(0))
    >>> [net.submodel_numel(s) for s in range(1, 5)]
    [1226, 20042, 56970, 122570]
    >>> net.submodel_params(1)
    ['conv1.weight', 'conv1.bias', 'heads.0.weight', 'heads.0.bias']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, cast

import torch
from torch import Tensor, nn

HEADS = "heads"


@dataclass(frozen=True)
class Unit:
    """One feature unit of a staged model.

    Attributes:
        name: label, e.g. ``"layer2.0"`` or ``"stem"``.
        prefixes: parameter-name prefixes owned by this unit, e.g. ``("layer2.0.",)`` or
            ``("conv1.", "norm1.")``; may be empty for a parameter-free unit.
        width: channels (4-D output) or features (2-D output) after the unit.
        forward: the unit's computation, using the base model's child modules.
    """

    name: str
    prefixes: tuple[str, ...]
    width: int
    forward: Callable[[Tensor], Tensor]


class Staged(Protocol):
    """What a model provides to be trained progressively.

    Attributes:
        default_stages: the paper's (or a natural) number of stages S.
        classifier_prefixes: parameter-name prefixes of the model's own classifier ``G_S``.
    """

    default_stages: int
    classifier_prefixes: tuple[str, ...]

    def units(self) -> list[Unit]:
        """The ordered feature units ``E`` (their composition + ``classify`` = forward)."""
        ...

    def classify(self, h: Tensor) -> Tensor:
        """``G_S`` on the last unit's output, including its own pooling / flattening."""
        ...

    def stage_cuts(self, stages: int) -> list[int]:
        """``[c_1, …, c_S]``: cumulative unit counts, ``c_S == len(units)``.

        Raises:
            ValueError: ``stages`` is not supported; the message names the allowed values.
        """
        ...


def is_staged(model: nn.Module) -> bool:
    """Whether ``model`` implements :class:`Staged` (units, classify, stage_cuts, ...)."""
    return (
        all(callable(getattr(model, m, None)) for m in ("units", "classify", "stage_cuts"))
        and isinstance(getattr(model, "default_stages", None), int)
        and isinstance(getattr(model, "classifier_prefixes", None), tuple)
    )


def even_cuts(num_units: int, stages: int) -> list[int]:
    """Balanced split of ``num_units`` units into ``stages`` stages.

    ``c_s = ceil(s·U/S)`` for ``S ≤ U``; for ``S = U + 1`` stage ``s ≤ U`` holds unit ``s`` and
    the last stage adds no feature unit (only the classifier grows).

    Args:
        num_units: U, the number of feature units (>= 0).
        stages: S, in ``1 … U + 1``.

    Returns:
        ``[c_1, …, c_S]`` with ``c_S = U``.

    Raises:
        ValueError: ``stages`` outside ``1 … U + 1``.
    """
    if isinstance(stages, bool) or not isinstance(stages, int) or not 1 <= stages <= num_units + 1:
        raise ValueError(
            f"stages must be an int in 1..{num_units + 1} (the model has {num_units} feature "
            f"units), got {stages!r}"
        )
    if stages <= num_units:
        return [-(-s * num_units // stages) for s in range(1, stages + 1)]
    return [*range(1, num_units + 1), num_units]


def table_cuts(table: Mapping[int, tuple[int, ...]], num_units: int, stages: int) -> list[int]:
    """``table[stages]`` if listed (the paper's splits), else ``even_cuts``."""
    cuts = even_cuts(num_units, stages)  # validates stages
    return list(table[stages]) if stages in table else cuts


class TempHead(nn.Linear):
    """Temporary head ``G_s`` (s < S): global average pooling over dims (2, 3) of a 4-D input
    (none for a 2-D input), then ``Linear(width, num_classes)``."""

    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 4:
            x = x.mean(dim=(2, 3))  # (B, width)
        return super().forward(x)  # (B, num_classes)


class _StageView(nn.Module):
    """``M^s`` for ``s < S``: the ProgressiveNet's child modules (all of them) under the same
    names; forward runs the first ``c_s`` units and then ``heads[s-1]``."""

    def __init__(self, net: ProgressiveNet, stage: int) -> None:
        super().__init__()
        for name, child in net.named_children():
            self.add_module(name, child)
        object.__setattr__(self, "_net", net)  # not a child: no recursion in .modules()
        self.stage = stage

    def forward(self, x: Tensor) -> Tensor:
        net: ProgressiveNet = self.__dict__["_net"]
        for unit in net.base.units()[: net.cuts[self.stage - 1]]:
            x = unit.forward(x)
        heads = cast(nn.ModuleList, getattr(self, HEADS))
        out: Tensor = heads[self.stage - 1](x)
        return out

    def extra_repr(self) -> str:
        return f"stage={self.stage}"


class ProgressiveNet(nn.Module):
    """A staged model plus ProgFed's temporary heads, with one view module per stage.

    Args:
        base: a :class:`Staged` model whose parameters all live in child modules.
        stages: S (see ``base.stage_cuts`` for the allowed values).
        num_classes: output width of the temporary heads.
        generator: the only randomness used to initialise the heads (the global RNG is left as
            it was).

    Raises:
        ValueError: ``base`` is not staged, has parameters directly on itself, or does not
            support ``stages``.
    """

    def __init__(
        self, base: nn.Module, stages: int, num_classes: int, generator: torch.Generator
    ) -> None:
        super().__init__()
        if not is_staged(base):
            raise ValueError(
                f"{type(base).__name__} is not a staged model (it lacks units / classify / "
                "stage_cuts), so it cannot be trained progressively"
            )
        own = [name for name, _ in base.named_parameters(recurse=False)]
        if own:
            raise ValueError(
                f"{type(base).__name__} holds parameters {own} directly on itself; a "
                "ProgressiveNet needs every parameter inside a child module"
            )
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
        staged = cast(Staged, base)
        cuts = staged.stage_cuts(stages)
        units = staged.units()
        for name, child in base.named_children():
            if name == HEADS:
                raise ValueError(f"{type(base).__name__} already has a child named {HEADS!r}")
            self.add_module(name, child)
        object.__setattr__(self, "_base", base)  # not a child: its modules are adopted above
        object.__setattr__(self, "_views", {})  # stage -> _StageView, outside the module tree
        self.stages = stages
        self.cuts = cuts
        self.num_classes = num_classes
        seed = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):  # the same heads anywhere
            torch.manual_seed(seed)
            heads = nn.ModuleList(TempHead(units[c - 1].width, num_classes) for c in cuts[:-1])
        ref = next(base.parameters(), None)
        if ref is not None:
            heads = heads.to(device=ref.device, dtype=ref.dtype)
        self.heads = heads

    @property
    def base(self) -> Staged:
        """The wrapped model (its child modules are this net's, minus ``heads``)."""
        return cast(Staged, self.__dict__["_base"])

    def forward(self, x: Tensor) -> Tensor:
        """The full model ``M = M^S`` (the base model's forward)."""
        out: Tensor = self.__dict__["_base"](x)
        return out

    def at_stage(self, stage: int) -> nn.Module:
        """The module computing ``M^s`` (``self`` for ``s = S``), cached per stage.

        It registers the same child modules as this net, so parameter names are identical and
        ``functional_call(view, params)`` needs only the sub-model's parameters.
        """
        self._check_stage(stage)
        if stage == self.stages:
            return self
        views: dict[int, nn.Module] = self.__dict__["_views"]
        if stage not in views:
            views[stage] = _StageView(self, stage)
        return views[stage]

    def block_params(self, stage: int) -> list[str]:
        """Names of ``E_s``'s parameters (empty when stage ``s`` adds no feature unit)."""
        self._check_stage(stage)
        lo = self.cuts[stage - 2] if stage > 1 else 0
        prefixes = tuple(
            p for u in self.base.units()[lo : self.cuts[stage - 1]] for p in u.prefixes
        )
        return self._names(prefixes)

    def head_params(self, stage: int) -> list[str]:
        """Names of ``G_s``'s parameters: ``heads.{s-1}.*`` for ``s < S``, the classifier's for
        ``s = S``."""
        self._check_stage(stage)
        if stage < self.stages:
            return self._names((f"{HEADS}.{stage - 1}.",))
        return self._names(self.base.classifier_prefixes)

    def submodel_params(self, stage: int) -> list[str]:
        """Names of ``M^s``'s parameters (blocks ``1 … s`` and head ``s``), in
        ``named_parameters()`` order."""
        self._check_stage(stage)
        wanted = {n for s in range(1, stage + 1) for n in self.block_params(s)}
        wanted.update(self.head_params(stage))
        return [n for n, _ in self.named_parameters() if n in wanted]

    def submodel_numel(self, stage: int) -> int:
        """Number of scalar parameters of ``M^s`` (with its head)."""
        numels = {n: p.numel() for n, p in self.named_parameters()}
        return sum(numels[n] for n in self.submodel_params(stage))

    def dense_numel(self) -> int:
        """Number of scalar parameters of the base model (without the temporary heads)."""
        return sum(p.numel() for p in self.__dict__["_base"].parameters())

    def stage_of(self, params: Mapping[str, Tensor]) -> int:
        """The stage whose sub-model ``params`` describe: S without any ``heads.`` key, else the
        stage of the head present.

        Raises:
            ValueError: two different heads are present, or a head index is out of range.
        """
        found = sorted({int(k.split(".")[1]) for k in params if k.startswith(f"{HEADS}.")})
        if not found:
            return self.stages
        if len(found) > 1:
            raise ValueError(f"params hold several temporary heads {found}; expected at most one")
        if found[0] >= self.stages - 1:
            raise ValueError(
                f"params hold head {found[0]}, but this net has heads 0..{self.stages - 2}"
            )
        return found[0] + 1

    def for_params(self, params: Mapping[str, Tensor]) -> nn.Module:
        """The module to run ``params`` with: ``at_stage(stage_of(params))``."""
        return self.at_stage(self.stage_of(params))

    def extra_repr(self) -> str:
        return f"stages={self.stages}, cuts={self.cuts}, num_classes={self.num_classes}"

    def _check_stage(self, stage: int) -> None:
        if isinstance(stage, bool) or not isinstance(stage, int) or not 1 <= stage <= self.stages:
            raise ValueError(f"stage must be an int in 1..{self.stages}, got {stage!r}")

    def _names(self, prefixes: tuple[str, ...]) -> list[str]:
        if not prefixes:
            return []
        return [n for n, _ in self.named_parameters() if n.startswith(prefixes)]


def structure_for(model: nn.Module, params: Mapping[str, Tensor]) -> nn.Module:
    """The module to run ``params`` with: ``model.for_params(params)`` for a progressive net
    (the sub-model the parameters describe), else ``model`` itself."""
    for_params = getattr(model, "for_params", None)
    if callable(for_params):
        return cast(nn.Module, for_params(params))
    return model


def dense_numel(model: nn.Module) -> int:
    """Size of the full model: ``model.dense_numel()`` if it has one (a progressive net, without
    its temporary heads), else its parameter count."""
    fn = getattr(model, "dense_numel", None)
    if callable(fn):
        return int(fn())
    return sum(p.numel() for p in model.parameters())
