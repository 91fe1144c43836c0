"""The sub-model family's codec: a sub-model as its kept values plus its pattern.

A message (:func:`encode`) holds, per parameter, the values of the sub-model's entries (``Dense``,
32 bits each, row-major order of the mask) and the parameter's full-shape bool keep mask as
``Free`` (``keep/<param>``, 0 bits: the receiver replays or derives it). A server-chosen pattern
the client cannot derive rides along as the hidden layers' unit masks (``unit/<layer>``):
``Mask`` (1 bit per hidden unit, counted) or ``Free`` (sent but not charged). The output layer
is never dropped and needs no pattern.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from fedcomm.algorithms.submodel.units import param_masks
from fedcomm.comm.payload import Dense, Entry, Free, Mask
from fedcomm.models.groups import GroupSpec
from fedcomm.types import ParamDict

KEEP = "keep/"  # f"keep/{param}": the Free keep mask next to a parameter's kept values
UNIT = "unit/"  # f"unit/{layer}": a hidden layer's (count,) unit keep mask

Pattern = type[Free] | type[Mask] | None  # how the unit masks travel (None: not at all)


def encode_kept(tensors: Mapping[str, Tensor], keep: Mapping[str, Tensor]) -> dict[str, Entry]:
    """Each tensor's kept values (32 bits each) plus its full-shape bool keep mask as ``Free``
    (replayed by the receiver from the shared seed)."""
    out: dict[str, Entry] = {k: Dense(t.detach()[keep[k]]) for k, t in tensors.items()}  # 32·kept
    return out | {KEEP + k: Free(keep[k]) for k in tensors}  # 0 bits


def keep_masks(decoded: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The keep masks of a decoded :func:`encode_kept` message, by parameter."""
    return {k.removeprefix(KEEP): v for k, v in decoded.items() if k.startswith(KEEP)}


def decode_kept(decoded: Mapping[str, Tensor]) -> ParamDict:
    """Inverse of :func:`encode_kept`: full tensors, zeros off the keep masks."""
    out: ParamDict = {}
    for name, keep in keep_masks(decoded).items():
        out[name] = decoded[name].new_zeros(keep.shape)
        out[name][keep] = decoded[name]
    return out


def pattern_entries(
    layers: Sequence[GroupSpec], keep: Mapping[str, Tensor], entry: type[Free] | type[Mask]
) -> dict[str, Entry]:
    """The hidden layers' unit keep masks as ``entry``: ``Mask`` (1 bit per unit) or ``Free``.
    The output layer is never dropped and needs no pattern."""
    return {UNIT + s.name: entry(keep[s.name]) for s in layers if not s.is_output}


def encode(
    params: Mapping[str, Tensor],
    layers: Sequence[GroupSpec],
    keep: Mapping[str, Tensor],
    pattern: Pattern = None,
) -> dict[str, Entry]:
    """The sub-model of unit keep masks ``keep``: kept values (32 bits each), full-shape masks
    (``Free``) and, with ``pattern``, the unit masks as that entry."""
    out = encode_kept(params, param_masks(layers, keep, params))
    return out if pattern is None else out | pattern_entries(layers, keep, pattern)


def uploaded_model(down: Mapping[str, Tensor], up: Mapping[str, Tensor]) -> ParamDict:
    """The sub-model a client uploaded: its download plus its delta (zeros off the sub-model)."""
    delta = decode_kept(up)
    return {k: w + delta[k] for k, w in decode_kept(down).items()}
