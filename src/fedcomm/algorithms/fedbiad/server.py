"""FedBIAD's upload and the server's aggregation (Algorithm 1, lines 5-7 and 28; Eq. 10).

Upload: ``β^{k,V}`` (1 bit per row, all J rows) and the kept rows' values (32 bits each); the
parameters in no droppable row (GroupNorm, the output layer without ``drop_output_layer``, the
recurrent matrices ``lstm_rows`` leaves out) densely.

Server (``aggregation``; Eq. 10, Section IV-E, reads three ways):

* ``masked`` (default): per row, the ``|D_k|``-weighted mean over the clients that kept it; rows
  nobody kept stay ``U_{r−1}`` (the FedDrop/HeteroFL/FjORD convention);
* ``fill``: Eq. 10 over each client's *complete* parameters, its dropped rows reconstructed as
  ``U_{r−1}`` (each row's update damped by the share of clients that kept it);
* ``eq10``: Eq. 10 as printed, ``U_r = Σ_k |D_k| β_k ∘ U_k / Σ_k |D_k|``: a dropped row counts as
  0, so every row shrinks by about ``(1 − p)`` a round. It cannot give the paper's own numbers
  (the MNIST profile: 75.4 ± 0.7% vs ``masked``'s 93.5 ± 0.1%, 3 seeds; in an independent check
  on 1000 IID clients it falls to 10% by round 60 with ``‖fc1.W‖ → 0.002``, with or without the
  KL), so it is not the default; kept as the literal reading (``docs/reproductions/fedbiad.md``).

``next_columns``: the next layer's input columns that read a dropped row are sent whole, but
no gradient reaches them at that client (their input is 0); ``all`` (default: Eq. 10 over the
uploaded weights) averages them over every client, ``holders`` over the clients that kept the
row (FedDrop's rule; sequential mlp/cnn only; the server's rule alone, the bits are the same).
The averaging rule gives ``Δ = U_agg − U_{r−1}``, and
``U_r = U_{r−1} + server_opt(Δ)`` (default ``sgd``, lr 1: exactly the rule above). The download
is the dense ``U_{r−1}`` (32·N bits); the global model evaluated is ``θ = U_r``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import Tensor, nn

from fedcomm.algorithms.core import Uplink
from fedcomm.algorithms.core.grouped import decode_groups, encode_groups, entry_masks
from fedcomm.algorithms.fedbiad.rows import validate_model
from fedcomm.algorithms.submodel.units import param_masks, unit_layers
from fedcomm.comm.payload import Entry, Free, Payload
from fedcomm.models.groups import GroupSpec
from fedcomm.types import ParamDict

MASK = "mask/"  # f"mask/{spec}": β of one row layer, 1 bit per row (comm.payload.Mask)
KEEP = "keep/"  # f"keep/{param}": the entry mask β expands to (Free: the receiver rebuilds it)


# --- the upload (Algorithm 1, line 28) ----------------------------------------------------------


def encode_upload(
    params: Mapping[str, Tensor], specs: Sequence[GroupSpec], beta: Mapping[str, Tensor]
) -> Payload:
    """``w/<param>``: kept rows' updates ``U_k − U_{r−1}`` (32 bits each; unrowed parameters
    whole; the update rather than the weights, so that uplink compressors such as DGC compress
    the update, as FedBIAD+DGC requires — the same bits), ``mask/<spec>``:
    ``β`` (1 bit per row), ``keep/<param>``: the entry masks ``β`` expands to (``Free``: the
    server rebuilds them from ``β`` and the model structure)."""
    entries: dict[str, Entry] = dict(encode_groups(params, specs, beta, send_masks=True))
    for name, m in entry_masks(specs, beta, params).items():
        entries[KEEP + name] = Free(m)
    return Payload(entries)


def uploaded_model(down: Mapping[str, Tensor], up: Mapping[str, Tensor]) -> ParamDict:
    """``β_k ∘ U_k`` from the downloaded ``U_{r−1}`` and the sent updates: zeros on dropped
    rows (unrowed parameters: ``U_{r−1}`` + their update)."""
    out: ParamDict = {}
    for name, ref in down.items():
        values = up[f"w/{name}"]
        keep = up.get(KEEP + name)
        if keep is None:
            out[name] = ref + values.reshape(ref.shape)
        else:
            out[name] = torch.zeros_like(ref)
            out[name][keep.bool()] = ref[keep.bool()] + values
    return out


def holder_masks(
    model: nn.Module | None,
    specs: Sequence[GroupSpec],
    beta: Mapping[str, Tensor],
    params: Mapping[str, Tensor],
) -> dict[str, Tensor]:
    """``next_columns: holders``: the entry masks of ``β`` plus, in the next layer, the input
    columns reading each dropped row (FedDrop's sub-model masks; every parameter present)."""
    layers = unit_layers(model, "fedbiad")  # ValueError for non-sequential models
    whole = {s.name: torch.ones(s.count, dtype=torch.bool, device="cpu") for s in layers}
    return param_masks(layers, whole | {s.name: beta[s.name] for s in specs}, params)


def check_model(next_columns: str, model: nn.Module) -> None:
    """The model has rows to drop, and (``next_columns: holders``) is a sequential chain."""
    validate_model(model)
    if next_columns != "holders":
        return
    try:
        unit_layers(model, "fedbiad")  # the sequential chains holder_masks works on
    except ValueError:
        raise ValueError(
            "fedbiad: next_columns 'holders' needs a sequential model (mlp, cnn, "
            f"mnist_cnn), not {type(model).__name__}; use next_columns: all"
        ) from None


def reconstruct(
    uplink: Uplink,
    params: Mapping[str, Tensor],
    specs: Sequence[GroupSpec],
    model: nn.Module | None,
    holders: bool,
) -> tuple[ParamDict, dict[str, Tensor]]:
    """Algorithm 1, line 7: ``(β_k ∘ U_k, its entry masks)`` reconstructed from one upload and
    the server's ``U_{r−1}`` (``holders``: the masks also cover the next layer's columns reading
    the dropped rows)."""
    beta = {s.name: uplink.tensors[MASK + s.name].bool() for s in specs}
    update = decode_groups(uplink.tensors, params, specs, beta)  # 0 off the rows
    masks = (
        holder_masks(model, specs, beta, params) if holders else entry_masks(specs, beta, params)
    )
    values = {
        k: torch.where(masks[k], p + update[k], 0.0) if k in masks else p + update[k]
        for k, p in params.items()
    }
    return values, masks


# --- Eq. 10, three readings -----------------------------------------------------------------------


def aggregate(
    prev: Mapping[str, Tensor],
    got: Iterable[tuple[Mapping[str, Tensor], Mapping[str, Tensor]]],
    weights: Sequence[float],
    how: str,
) -> tuple[ParamDict, dict[str, Tensor]]:
    """Eq. 10: ``(Δ, held)`` with ``U_agg = U_{r−1} + Δ``.

    ``got`` yields, per client k, its decoded ``β_k ∘ U_k`` (zeros off its rows) and its bool
    entry masks (parameters absent: always sent), in the order of ``weights``. ``eq10``: ``Δ =
    Σ_k w_k (β_k ∘ U_k − U_{r−1}) / Σ_k w_k``; ``fill``: ``Σ_k w_k β_k (U_k − U_{r−1}) / Σ_k w_k``
    (Eq. 10 over complete parameters, a dropped row reconstructed as ``U_{r−1}``); ``masked``:
    ``Σ_k w_k β_k (U_k − U_{r−1}) / Σ_k w_k β_k`` where some client kept the entry, 0 elsewhere
    (``held`` says where).

    One client at a time (``got`` may be a generator): the sums run in client order per entry,
    as :func:`~fedcomm.algorithms.core.weighted_mean` over all of them does (the same bits), but
    only one client's dense model and update are alive, not K of each (the PTB LSTM's 29.8 MB at
    10 clients: 2 x 10 x 29.8 MB held at once before, and glibc kept the heap they grew as RSS).
    """
    total = float(sum(weights))
    if total <= 0:
        raise ValueError(f"weights must sum to > 0, got {list(weights)}")
    mean = {k: torch.zeros_like(t) for k, t in prev.items()}  # Σ_k w_k β_k δ_k / Σ_k w_k
    kept: list[Mapping[str, Tensor]] = []
    for (v, km), w in zip(got, weights, strict=True):
        for k, t in prev.items():
            if how == "eq10" or k not in km:
                mean[k].add_(v[k] - t, alpha=w / total)
            else:
                mean[k].add_(torch.where(km[k], v[k] - t, 0.0), alpha=w / total)
        kept.append(km)
    everywhere = {k: torch.ones_like(t, dtype=torch.bool) for k, t in prev.items()}
    if how in ("eq10", "fill"):  # fill: every client's dropped rows reconstructed as U_{r−1}
        return mean, everywhere
    share = torch.tensor(weights, dtype=torch.float64, device=next(iter(prev.values())).device)
    share = share / sum(weights)
    out, held = {}, {}
    for k, m in mean.items():
        if not any(k in km for km in kept):
            out[k], held[k] = m, everywhere[k]
            continue
        stacked = torch.stack([km[k] if k in km else everywhere[k] for km in kept])  # (K, *shape)
        held[k] = stacked.any(0)
        frac = (stacked * share.view(-1, *[1] * m.dim())).sum(0).to(m.dtype).clamp_min(1e-12)
        out[k] = torch.where(stacked.all(0), m, m / frac)
    return out, held
