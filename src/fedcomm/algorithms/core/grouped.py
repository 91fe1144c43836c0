"""Group-structured messages: send the entries of kept groups plus one bit per group.

Shared by the structured-sparsity algorithms (FedSparse, FedL1, ...). A group mask (one bool per
group of a :class:`~fedcomm.models.groups.GroupSpec`) expands to an entry mask per member
parameter; a message then carries the kept entries' values densely (``Dense``), in row-major
order, and the receiver rebuilds the full tensors from the same mask. Who pays for the mask (a
1-bit-per-group ``Mask`` entry, or nothing when both sides know it) is the algorithm's choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fedcomm.comm.payload import Dense, Entry, Mask
from fedcomm.models.groups import GroupSpec, expand_mask
from fedcomm.types import ParamDict


def entry_masks(
    specs: Sequence[GroupSpec], group_masks: Mapping[str, Tensor], params: Mapping[str, Tensor]
) -> dict[str, Tensor]:
    """Full-shape bool masks of every grouped parameter (ungrouped parameters are absent)."""
    out: dict[str, Tensor] = {}
    for spec in specs:
        for name, m in expand_mask(spec, group_masks[spec.name].bool(), params).items():
            out[name] = m.expand_as(params[name]).bool()  # (shape of the parameter)
    return out


def member_axes(specs: Sequence[GroupSpec]) -> dict[str, tuple[GroupSpec, int]]:
    """For each grouped parameter, the spec and axis whose mask applies to it (the last spec
    listing it, as in :func:`entry_masks`)."""
    return {name: (spec, axis) for spec in specs for name, axis in spec.members}


def _kept(group_masks: Mapping[str, Tensor], spec: GroupSpec) -> Tensor | None:
    """Indices of the kept groups; None when every group is kept."""
    bits = group_masks[spec.name].bool()
    return None if bool(bits.all()) else bits.nonzero().flatten()


def encode_groups(
    params: Mapping[str, Tensor],
    specs: Sequence[GroupSpec],
    group_masks: Mapping[str, Tensor],
    *,
    send_masks: bool,
    mask_over: Mapping[str, Tensor] | None = None,
) -> dict[str, Entry]:
    """Payload entries: ``w/<param>`` kept values of grouped parameters, ``w/<param>`` dense
    for ungrouped ones, and (``send_masks``) ``mask/<spec>`` one bit per group.

    ``mask_over`` restricts the sent mask bits to the groups where it is true (e.g. only the
    surviving groups, when the receiver knows the rest are pruned).
    """
    axes = member_axes(specs)
    entries: dict[str, Entry] = {}
    for name, t in params.items():
        values = t.detach()
        if name in axes:  # the kept slices along the group axis, row-major (= t[entry mask])
            spec, axis = axes[name]
            idx = _kept(group_masks, spec)
            values = (
                values if idx is None else values.index_select(axis, idx.to(values.device))
            ).reshape(-1)
        entries[f"w/{name}"] = Dense(values)  # (kept,) or the whole ungrouped tensor
    if send_masks:
        for spec in specs:
            bits = group_masks[spec.name].bool()
            if mask_over is not None:
                bits = bits[mask_over[spec.name].bool().to(bits.device)]
            entries[f"mask/{spec.name}"] = Mask(bits)
    return entries


def decode_groups(
    decoded: Mapping[str, Tensor],
    shapes: Mapping[str, Tensor],
    specs: Sequence[GroupSpec],
    group_masks: Mapping[str, Tensor],
) -> ParamDict:
    """Rebuild full tensors (zeros outside kept groups) from :func:`encode_groups`' values.

    ``shapes`` gives each parameter's shape and dtype (e.g. the receiver's own copy).
    """
    axes = member_axes(specs)
    out: ParamDict = {}
    for name, ref in shapes.items():
        values = decoded[f"w/{name}"]
        idx = _kept(group_masks, axes[name][0]) if name in axes else None
        if idx is None:  # ungrouped, or every group kept
            out[name] = values.reshape(ref.shape)
            continue
        axis = axes[name][1]
        sel = list(ref.shape)
        sel[axis] = idx.numel()
        out[name] = torch.zeros_like(ref).index_copy_(axis, idx.to(ref.device), values.reshape(sel))
    return out


def scatter_mask(bits: Tensor, over: Tensor) -> Tensor:
    """Mask bits sent only for the groups where ``over`` is true, back to a full group mask."""
    full = torch.zeros(over.shape, dtype=torch.bool, device=over.device)
    full[over.bool()] = bits.bool().to(over.device)
    return full
