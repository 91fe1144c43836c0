"""Uniform views of a model's prunable structure: FedSparse *groups* and FedBIAD *rows*.

A ``GroupSpec`` describes one layer's worth of structured slices: group ``g`` of a spec is, for
every member ``(param_name, axis)``, the slice ``params[param_name].select(axis, g)``. Sparse and
dropout algorithms work on ``(count,)`` masks per spec and turn them into parameter masks with
``expand_mask`` / ``apply_mask``; nothing else needs to know the layer types.

Two partitions (Louizos et al., FedSparse, eq. 23 and App. A; Xue et al., FedBIAD, eqs. 3-4):

- ``groups(model)``, FedSparse / FedL1 (after the L0 reference code of Louizos et al.): a conv
  layer has one group per output filter (``W[g]`` and ``b[g]``, kind ``"filter"``); a linear
  layer has one group per *input* feature (``W[:, g]``, kind ``"in_feature"``), its bias is not
  gated. Embedding, LSTM and GroupNorm parameters are not grouped: they are always kept.
- ``rows(model)``, FedBIAD: one row per output unit. Linear ``W[j, :]`` + ``b[j]`` (kind
  ``"row"``); conv ``W[j]`` + ``b[j]`` (kind ``"filter"``); each LSTM matrix ``weight_ih_l{k}``
  and ``weight_hh_l{k}`` separately (4H rows, with ``bias_ih_l{k}`` / ``bias_hh_l{k}``);
  embedding (an E x V map): row ``i`` is ``weight[:, i]``. GroupNorm affine parameters are not
  rows: they are always kept.

Specs are listed in module registration order, one per layer, named after the layer
(``"conv1"``, ``"layer2.0.shortcut.0"``) or, for LSTM matrices, after the matrix
(``"lstm.weight_ih_l0"``). The output layer (``is_output``) is the last Linear or Conv module
in registration order; every registered model registers its classifier last. A parameter shared
between modules (tied weights) belongs to the module that registers it first, as in
``model.named_parameters()``: with a tied LSTM decoder, the decoder's rows hold only its bias.

All functions below are pure: they never modify their inputs, and are differentiable in the
parameters and (float) masks, so ``apply_mask(params, specs, gates)`` can sit inside a loss.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

Kind = Literal["filter", "in_feature", "row"]

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


@dataclass(frozen=True)
class GroupSpec:
    """One layer's structured slices.

    Attributes:
        name: unique layer (or LSTM matrix) name, e.g. ``"conv1"``, ``"lstm.weight_ih_l0"``.
        kind: ``"filter"`` (conv output channel), ``"in_feature"`` (linear input column) or
            ``"row"`` (output unit of a linear / recurrent layer, or an embedding dimension).
        members: ``(parameter name, axis)`` pairs; group ``g`` is index ``g`` along ``axis``
            of each member. Names are those of ``model.named_parameters()``.
        count: number of groups in this layer.
        is_output: whether this is the output (classifier) layer.
    """

    name: str
    kind: Kind
    members: tuple[tuple[str, int], ...]
    count: int
    is_output: bool

    @property
    def param_names(self) -> tuple[str, ...]:
        """Names of the member parameters."""
        return tuple(name for name, _ in self.members)


@dataclass(frozen=True)
class _Layer:
    name: str
    module: nn.Module
    owned: dict[str, str]  # local parameter name -> full name, for params first seen here


def groups(model: nn.Module) -> list[GroupSpec]:
    """FedSparse / FedL1 groups: conv output filters and linear input features.

    Args:
        model: any module; only ``Conv{1,2,3}d`` and ``Linear`` layers are grouped.

    Returns:
        One spec per conv / linear layer, in registration order.
    """
    layers = list(_layers(model))
    output = _output_layer(layers)
    specs = []
    for layer in layers:
        m = layer.module
        if isinstance(m, _CONV):
            spec = _spec(layer, "filter", (("weight", 0), ("bias", 0)), m.out_channels, output)
        elif isinstance(m, nn.Linear):
            spec = _spec(layer, "in_feature", (("weight", 1),), m.in_features, output)
        else:
            continue
        if spec is not None:
            specs.append(spec)
    return specs


def rows(model: nn.Module) -> list[GroupSpec]:
    """FedBIAD rows: output units of linear, conv, recurrent and embedding layers.

    Args:
        model: any module; ``Linear``, ``Conv{1,2,3}d``, ``LSTM``/``GRU``/``RNN`` and
            ``Embedding`` layers have rows; other parameters (GroupNorm) have none.

    Returns:
        One spec per layer (per weight matrix for recurrent layers), in registration order.
    """
    layers = list(_layers(model))
    output = _output_layer(layers)
    specs: list[GroupSpec | None] = []
    for layer in layers:
        m = layer.module
        if isinstance(m, _CONV):
            specs.append(
                _spec(layer, "filter", (("weight", 0), ("bias", 0)), m.out_channels, output)
            )
        elif isinstance(m, nn.Linear):
            specs.append(_spec(layer, "row", (("weight", 0), ("bias", 0)), m.out_features, output))
        elif isinstance(m, nn.Embedding):
            specs.append(_spec(layer, "row", (("weight", 1),), m.embedding_dim, output))
        elif isinstance(m, nn.RNNBase):
            specs.extend(_recurrent_rows(layer))
    return [s for s in specs if s is not None]


def group_norms(params: Mapping[str, Tensor], spec: GroupSpec) -> Tensor:
    """L2 norm of each group over all of its members' slices.

    The gradient at an all-zero group is 0 (``torch.linalg.vector_norm``'s subgradient).

    Args:
        params: parameters by name (at least the spec's members).
        spec: the layer.

    Returns:
        ``(count,)`` norms.
    """
    per = []  # each member's (count,) norms, reduced in place (no copies: this runs every step)
    for name, axis in spec.members:
        t = _check(params, spec, name, axis)
        rest = [d for d in range(t.dim()) if d != axis]
        per.append(torch.linalg.vector_norm(t, dim=rest) if rest else t.abs())
    return per[0] if len(per) == 1 else torch.linalg.vector_norm(torch.stack(per), dim=0)


def group_norms_detached(params: Mapping[str, Tensor], spec: GroupSpec) -> Tensor:
    """:func:`group_norms` without a gradient, as ``sqrt(Σ x²)``: a plain sum reduces a
    strided axis (a linear layer's input columns) several times faster than
    ``vector_norm``, which matters where norms are taken every step (FedSparse's gates)."""
    with torch.no_grad():
        total = None
        for name, axis in spec.members:
            t = _check(params, spec, name, axis).detach()
            rest = [d for d in range(t.dim()) if d != axis]
            sq = t.square().sum(rest) if rest else t.square()
            total = sq if total is None else total + sq
        assert total is not None
        return total.sqrt()


def group_sizes(spec: GroupSpec, params: Mapping[str, Tensor]) -> Tensor:
    """Number of scalar parameters in each group, over all members.

    Args:
        spec: the layer.
        params: parameters by name (only shapes are read).

    Returns:
        ``(count,)`` int64 sizes (equal within a layer).
    """
    size = sum(_check(params, spec, n, a).numel() // spec.count for n, a in spec.members)
    device = params[spec.members[0][0]].device
    return torch.full((spec.count,), size, dtype=torch.int64, device=device)


def expand_mask(spec: GroupSpec, mask: Tensor, params: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Turn a per-group mask into per-parameter masks.

    Args:
        spec: the layer.
        mask: ``(count,)`` bool or float mask (1 = keep); float masks may be soft gates.
        params: parameters by name (shapes and dtypes are read).

    Returns:
        For each member parameter, a mask in its dtype that broadcasts against it: size
        ``count`` along the member axis and 1 elsewhere.
    """
    if mask.shape != (spec.count,):
        raise ValueError(
            f"mask for {spec.name!r} has shape {tuple(mask.shape)}, expected ({spec.count},)"
        )
    out = {}
    for name, axis in spec.members:
        param = _check(params, spec, name, axis)
        shape = [1] * param.dim()
        shape[axis] = spec.count
        out[name] = mask.to(dtype=param.dtype, device=param.device).reshape(shape)
    return out


def apply_mask(
    params: Mapping[str, Tensor], specs: Sequence[GroupSpec], masks: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Multiply the parameters of the masked groups by their masks.

    Args:
        params: parameters by name.
        specs: the layers the masks refer to.
        masks: ``(count,)`` masks keyed by ``spec.name``; specs without a mask are left alone.

    Returns:
        A new dict with every parameter of ``params``: masked tensors where a mask applies, the
        original tensors otherwise.

    Raises:
        ValueError: a mask key names no spec, or a mask has the wrong shape.
    """
    by_name = {spec.name: spec for spec in specs}
    unknown = sorted(set(masks) - set(by_name))
    if unknown:
        raise ValueError(f"masks for unknown groups {unknown}; known: {sorted(by_name)}")
    out = dict(params)
    for name, mask in masks.items():
        for param_name, m in expand_mask(by_name[name], mask, params).items():
            out[param_name] = out[param_name] * m
    return out


def ungrouped(params: Mapping[str, Tensor], specs: Sequence[GroupSpec]) -> tuple[str, ...]:
    """Names of the parameters that belong to no spec (e.g. FC biases under ``groups``,
    GroupNorm affine parameters, embeddings): the always-kept part of the model."""
    covered = {name for spec in specs for name in spec.param_names}
    return tuple(name for name in params if name not in covered)


def _layers(model: nn.Module) -> Iterator[_Layer]:
    """Modules in registration order with the parameters each one owns (first registration)."""
    seen: set[int] = set()
    for prefix, module in model.named_modules():
        owned = {}
        for local, param in module.named_parameters(recurse=False):
            if id(param) not in seen:
                seen.add(id(param))
                owned[local] = f"{prefix}.{local}" if prefix else local
        yield _Layer(prefix, module, owned)


def _output_layer(layers: Sequence[_Layer]) -> str | None:
    candidates = [
        layer.name
        for layer in layers
        if isinstance(layer.module, (nn.Linear, *_CONV)) and layer.owned
    ]
    return candidates[-1] if candidates else None


def _spec(
    layer: _Layer,
    kind: Kind,
    members: tuple[tuple[str, int], ...],
    count: int,
    output: str | None,
    name: str | None = None,
) -> GroupSpec | None:
    """A spec over the members ``layer`` owns (None if it owns none of them)."""
    owned = tuple((layer.owned[local], axis) for local, axis in members if local in layer.owned)
    if not owned:
        return None
    return GroupSpec(name or layer.name, kind, owned, count, layer.name == output)


def _recurrent_rows(layer: _Layer) -> Iterator[GroupSpec | None]:
    """One spec per recurrent weight matrix (``weight_ih_l0``, ``weight_hh_l0_reverse``, ...)."""
    for local in layer.owned:
        if local.startswith("weight_"):
            bias = "bias_" + local.removeprefix("weight_")
            count = int(getattr(layer.module, local).shape[0])
            full = f"{layer.name}.{local}" if layer.name else local
            yield _spec(layer, "row", ((local, 0), (bias, 0)), count, None, name=full)


def _check(params: Mapping[str, Tensor], spec: GroupSpec, name: str, axis: int) -> Tensor:
    if name not in params:
        raise KeyError(f"group {spec.name!r}: parameter {name!r} missing from params")
    param = params[name]
    if param.shape[axis] != spec.count:
        raise ValueError(
            f"group {spec.name!r}: {name!r} has size {param.shape[axis]} along axis {axis}, "
            f"expected {spec.count}"
        )
    return param
