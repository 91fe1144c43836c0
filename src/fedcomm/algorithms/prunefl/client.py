"""PruneFL's client mechanics: its messages and its masked local training.

* down: ``w/<name>`` the active values of a maskable weight (its mask's row-major order) or the
  whole of a dense tensor (32 bits each); ``mask/<name>`` the mask, ``Mask`` (1 bit per entry)
  unless the client holds it (``Free``); ``mask_version`` (``Free``) which mask that is;
* up: ``w/<name>`` the client's update on the same entries; in readjustment rounds also
  ``grad/<name>``, the dense last-minibatch gradient of every maskable entry (32 bits each).

With ``N_m`` maskable entries, ``d`` the mask's density and ``B`` dense entries: down
``32·d·N_m + 32·B`` bits, plus ``N_m`` mask bits only when the mask changed since this client
last got one (clients start holding the all-ones mask, as in FedDST; otherwise the mask is
``Free``: the client reuses its copy); up ``32·d·N_m + 32·B`` bits, plus ``32·N_m`` for the
gradient in rounds ``first_readjust + k·readjust_every``.

Both ends know the mask, so the values are packed and unpacked against it (:func:`pack`,
:func:`unpack`): an upload carries no mask. The client trains only the active weights and keeps
the last minibatch's gradient (:func:`train_masked`); its state is the version of the mask it
holds (:class:`ClientState`). The server averages the uploaded gradients (:func:`mean_gradient`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fedcomm.algorithms.core import ClientData, Uplink, weighted_mean
from fedcomm.algorithms.core import local as _local
from fedcomm.algorithms.sparse import masks as _masks
from fedcomm.comm.payload import Dense, Entry, Free, Mask, Payload
from fedcomm.types import ParamDict

W = "w/"  # f"w/{param}": active values (maskable) or the whole tensor (dense), 32 bits each
MASK = "mask/"  # f"mask/{param}": the mask (Mask: 1 bit per entry; Free: the client's own copy)
GRAD = "grad/"  # f"grad/{param}": the dense last-minibatch gradient (readjustment rounds only)
VERSION = "mask_version"  # Free: which mask the client now holds (simulator bookkeeping)


@dataclass(frozen=True)
class ClientState:
    mask_version: int = 0  # the mask the client holds; 0 = the all-ones mask it starts with


def pack(tensors: Mapping[str, Tensor], masks: Mapping[str, Tensor]) -> dict[str, Entry]:
    """``w/<name>``: the active entries of a maskable tensor, the whole of any other."""
    return {
        W + k: Dense(v.detach()[masks[k]] if k in masks else v.detach()) for k, v in tensors.items()
    }


def unpack(
    decoded: Mapping[str, Tensor], shapes: Mapping[str, Tensor], masks: Mapping[str, Tensor]
) -> ParamDict:
    """Inverse of :func:`pack` (``shapes``: tensors of the receiver's shapes; zeros off masks)."""
    out: ParamDict = {}
    for k, ref in shapes.items():
        values = decoded[W + k].reshape(-1)
        if k in masks:
            out[k] = torch.zeros(ref.shape, dtype=values.dtype, device=ref.device)
            out[k][masks[k]] = values
        else:
            out[k] = values.reshape(ref.shape).clone()
    return out


def downlink(
    params: Mapping[str, Tensor], masks: Mapping[str, Tensor], version: int, fresh: bool
) -> Payload:
    """The global model on its mask, the mask itself ``Free`` if the client holds it."""
    entries = pack(params, masks)
    entries |= {MASK + k: Free(m) if fresh else Mask(m) for k, m in masks.items()}
    entries[VERSION] = Free(torch.tensor(version, device="cpu"))  # (a host counter)
    return Payload(entries)


def masks_of(down: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The masks a decoded downlink carries."""
    return {k[len(MASK) :]: m.bool() for k, m in down.items() if k.startswith(MASK)}


def uploaded_model(down: Mapping[str, Tensor], up: Mapping[str, Tensor]) -> ParamDict:
    """The model a client's upload stands for: the downloaded model plus the sent update."""
    masks = masks_of(down)
    names = [k[len(W) :] for k in down if k.startswith(W)]
    shapes = {k: masks[k] if k in masks else down[W + k] for k in names}
    start = unpack(down, shapes, masks)
    delta = unpack(up, shapes, masks)
    return {k: start[k] + delta[k] for k in names}


def mean_gradient(uplinks: Sequence[Uplink], masks: Mapping[str, Tensor]) -> ParamDict:
    """The unweighted mean (as the code) of the clients' uploaded ``grad/<name>``, one per mask."""
    grads = [{k: u.tensors[GRAD + k].reshape(m.shape) for k, m in masks.items()} for u in uplinks]
    return weighted_mean(grads, [1.0] * len(grads))


def train_masked(
    model: nn.Module,
    params: Mapping[str, Tensor],
    masks: Mapping[str, Tensor],
    data: ClientData,
    local: _local.LocalConfig,
    generator: torch.Generator,
) -> tuple[ParamDict, dict[str, Tensor], float]:
    """Local SGD on the active weights (masked-out ones zeroed after every step); returns the
    trained params, the last minibatch's gradient of every maskable entry (CE only, at the
    weights of that step, as ``param.grad`` in the code; zeros without data) and the mean loss."""
    last: dict[str, Tensor] = {}

    def capture(p: Mapping[str, Tensor], grads: dict[str, Tensor]) -> dict[str, Tensor]:
        last.update({k: grads[k] for k in masks})  # fresh autograd tensors, never updated in place
        return grads

    res = _local.local_sgd(
        model,
        _masks.apply_masks(params, masks),
        data,
        local,
        generator,
        grad_hook=capture,
        post_step=lambda live: _masks.apply_masks(live, masks),
    )
    grads = {
        k: last[k].detach().clone() if k in last else torch.zeros_like(params[k]) for k in masks
    }
    return res.params, grads, res.loss
