"""Codecs: tensors to payload entries and back.

``encode_dense`` sends every value; ``encode_sparse`` sends the non-zeros with a bitmap or
coordinate indices (the cheaper one unless a format is forced). Uplink compressors that wrap an
algorithm's uplink (DGC, STC, SignSGD, FedPAQ, LQ, SP in :mod:`fedcomm.comm.compressors`) are
registered in :data:`COMPRESSORS` and act on a whole :class:`~fedcomm.comm.payload.Payload`
with explicit per-client state.

The compressor contract:

* a compressor transforms only the payload's :class:`~fedcomm.comm.payload.Dense` entries with a
  floating dtype (they carry the update, e.g. ``Δ_k = w_k − w_t``), each as one flat vector;
  ``Mask``, ``Meta``, ``Free``, ``Sparse`` and non-float ``Dense`` entries pass through as the very
  same objects (so FedDrop/FedBIAD's kept values are compressed and their patterns are kept);
* its per-client state (e.g. DGC/STC residuals: entry name -> flat residual) is returned as a new
  value, never mutated; all randomness comes from the given generator;
* ``encode`` receives the 1-based round (for schedules such as DGC's sparsity warm-up);
* ``server_hook`` (optional) sees the round's *encoded* uplinks and returns the tensors the
  server should aggregate instead of their plain decoding (SignSGD's majority vote);
* bit costs come from the returned entries' ``nbits()``, i.e. from :mod:`fedcomm.comm.bits`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from fedcomm.comm import bits
from fedcomm.comm.payload import Dense, Payload, Sparse


def encode_dense(tensors: Mapping[str, Tensor], value_bits: int | None = None) -> Payload:
    """Every tensor sent densely (``value_bits`` per value; default: the dtype's width)."""
    return Payload({k: Dense(v.detach(), value_bits) for k, v in tensors.items()})


def encode_sparse_tensor(
    t: Tensor, fmt: bits.IndexFormat = "auto", index_bits: int | None = None
) -> Sparse:
    """The non-zeros of ``t`` with their flat positions; ``fmt='auto'`` picks the cheaper index."""
    flat = t.detach().reshape(-1)
    positions = torch.nonzero(flat, as_tuple=False).reshape(-1)  # (nnz,) int64
    chosen: bits.IndexFormat = fmt
    if fmt == "auto":
        chosen = bits.choose_index_format(int(positions.numel()), flat.numel(), index_bits)
    return Sparse(flat[positions], positions, tuple(t.shape), chosen, index_bits)


def encode_sparse(
    tensors: Mapping[str, Tensor], fmt: bits.IndexFormat = "auto", index_bits: int | None = None
) -> Payload:
    """Every tensor as non-zero values plus positions (see :func:`encode_sparse_tensor`)."""
    return Payload({k: encode_sparse_tensor(v, fmt, index_bits) for k, v in tensors.items()})


def encode_auto(tensors: Mapping[str, Tensor]) -> Payload:
    """Each tensor dense or sparse, whichever is smaller on the wire."""
    entries: dict[str, Dense | Sparse] = {}
    for k, v in tensors.items():
        sparse = encode_sparse_tensor(v)
        dense = Dense(v.detach())
        entries[k] = sparse if sparse.nbits().total < dense.nbits().total else dense
    return Payload(entries)


# --- uplink compressors: Payload -> Payload with explicit per-client state ---------------------

CompressorState = Any


EncodeFn = Callable[
    [Payload, CompressorState, torch.Generator, int], tuple[Payload, CompressorState]
]
ServerHook = Callable[[Sequence[Payload]], list[dict[str, Tensor]]]


@dataclass(frozen=True)
class Compressor:
    """An uplink transform: ``encode(payload, state, generator, round_) -> (payload, state)``.

    ``init()`` gives a client's initial state (kept in the client store between rounds).
    ``server_hook(payloads)``, if set, maps the round's encoded uplinks (cohort order) to the
    tensors each client's uplink is replaced by before ``algorithm.server_update``.
    """

    name: str
    init: Callable[[], CompressorState]
    encode: EncodeFn
    server_hook: ServerHook | None = None


def _identity() -> Compressor:
    return Compressor("none", init=lambda: None, encode=lambda p, s, g, r: (p, s))


COMPRESSORS: dict[str, Callable[..., Compressor]] = {"none": _identity}


def register_compressor(
    name: str,
) -> Callable[[Callable[..., Compressor]], Callable[..., Compressor]]:
    """Register a compressor factory under ``name``."""

    def deco(factory: Callable[..., Compressor]) -> Callable[..., Compressor]:
        if name in COMPRESSORS:
            raise ValueError(f"compressor {name!r} registered twice")
        COMPRESSORS[name] = factory
        return factory

    return deco


def build_compressor(name: str, **options: Any) -> Compressor:
    """The compressor registered as ``name`` built with ``options``."""
    if name not in COMPRESSORS:
        raise ValueError(f"unknown compressor {name!r}; registered: {sorted(COMPRESSORS)}")
    return COMPRESSORS[name](**options)


# The built-in compressors register themselves on import (the registry above exists by now).
from fedcomm.comm import compressors as _compressors  # noqa: E402, F401
