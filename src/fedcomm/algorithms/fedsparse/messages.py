"""What FedSparse sends (Section 3.1, "Reducing the communication cost"), per client and round.

- Down: ``32·(surviving weights, ungated parameters included) + 32·(surviving groups: v)
  + 1·(groups: the survival mask)``.
- Up: ``1·(surviving groups: z_s) + 32·(weights of the groups with z_s = 1 + ungated
  parameters)``; clients never upload ``v_s``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from fedcomm.algorithms.core.grouped import decode_groups, encode_groups, entry_masks
from fedcomm.comm.payload import Dense, Payload
from fedcomm.models.groups import GroupSpec
from fedcomm.types import ParamDict


def encode_downlink(
    params: ParamDict, v: ParamDict, alive: Mapping[str, Tensor], specs: Sequence[GroupSpec]
) -> Payload:
    """The surviving weights, ``v`` of the surviving groups, 1 bit per group."""
    entries = encode_groups(params, specs, alive, send_masks=True)
    for s in specs:  # v of the surviving groups only
        entries[f"v/{s.name}"] = Dense(v[s.name][alive[s.name]])
    return Payload(entries)


def decode_downlink(
    down: Mapping[str, Tensor], specs: Sequence[GroupSpec], shapes: ParamDict
) -> tuple[ParamDict, ParamDict, ParamDict]:
    """``(alive, w, v)`` from :func:`encode_downlink`'s decoded tensors; pruned groups are 0 in
    ``w`` and ``v``. ``shapes``: the receiver's parameters (shapes and dtypes)."""
    alive = {s.name: down[f"mask/{s.name}"].bool() for s in specs}  # (count,) per spec
    w = decode_groups(down, shapes, specs, alive)
    v = {
        s.name: torch.zeros(s.count, device=alive[s.name].device).masked_scatter(
            alive[s.name], down[f"v/{s.name}"]
        )
        for s in specs
    }
    return alive, w, v


def encode_upload(
    w_s: ParamDict, z: Mapping[str, Tensor], alive: Mapping[str, Tensor], specs: Sequence[GroupSpec]
) -> tuple[Payload, ParamDict]:
    """``z_s`` (1 bit per surviving group) and the weights of the kept groups, and what the
    server rebuilds from them: ``ŵ_s = z_s ⊙ w_s`` (Algorithm 2's return)."""
    sent = entry_masks(specs, z, w_s)
    uploaded = {k: t * sent[k] if k in sent else t for k, t in w_s.items()}  # z_s ⊙ w_s
    return Payload(encode_groups(w_s, specs, z, send_masks=True, mask_over=alive)), uploaded
