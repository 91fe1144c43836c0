"""PruneFL's maskable layers and per-entry times ``t_l`` (the costs its readjustment weighs).

Maskable: the ``weight`` of every Conv/Linear layer (first and last included), named as in
``model.named_parameters()`` (a shared weight once); biases and everything else are dense.

Per-entry times: the code hard-codes measured per-layer times; we cannot measure devices, so
``layer_time`` is ``uniform`` (default: every entry costs the same, i.e. a layer's time is
proportional to its parameter count), ``flops`` (an entry costs the multiply-adds it does per
example: output positions of a conv, 1 for a linear layer, measured on one training example),
both scaled so that the dense model takes time 1 (``c = 0.2`` then means a fixed per-round
overhead of 20 % of a dense round, close to the code's 0.2 s against ≈ 1.13 s for CIFAR-10), or
a list of per-entry times, one per maskable layer in model order, in the units of ``c`` (the
code's CIFAR-10 list with ``c = 0.2`` reproduces it).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

MASKABLE = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def maskable(model: nn.Module) -> list[str]:
    """Names of the Conv/Linear ``weight`` parameters, in model order."""
    names = {id(p): n for n, p in model.named_parameters()}
    out: dict[str, None] = {}  # ordered, shared weights once
    for mod in model.modules():
        w = getattr(mod, "weight", None)
        if isinstance(mod, MASKABLE) and isinstance(w, Tensor) and id(w) in names:
            out[names[id(w)]] = None
    return list(out)


def validate_model(model: nn.Module) -> None:
    if not maskable(model):
        raise ValueError(f"prunefl: {type(model).__name__} has no Conv/Linear weight to prune")


def entry_times(
    model: nn.Module, how: str | Sequence[float], example: Tensor | None
) -> dict[str, float]:
    """Per-entry time of each maskable layer: ``uniform``, ``flops`` (needs one ``example``
    input; entries of a layer cost its output positions per example) — both scaled so the dense
    model takes 1 — or the given list as is."""
    names = maskable(model)
    if not isinstance(how, str):
        if len(how) != len(names):
            raise ValueError(f"prunefl: layer_time has {len(how)} times for {len(names)} layers")
        return {n: float(t) for n, t in zip(names, how, strict=True)}
    params = dict(model.named_parameters())
    if how == "uniform":
        raw = dict.fromkeys(names, 1.0)
    else:
        if example is None:
            raise ValueError("prunefl: layer_time=flops needs an example input")
        raw = _positions(model, example)
    total = sum(raw[n] * params[n].numel() for n in names)
    return {n: raw[n] / total for n in names}


def _positions(model: nn.Module, example: Tensor) -> dict[str, float]:
    """Output positions per example of each maskable layer (summed over its calls)."""
    names = {id(p): n for n, p in model.named_parameters()}
    seen: dict[str, float] = {}
    hooks = []
    for mod in model.modules():
        if isinstance(mod, MASKABLE) and id(mod.weight) in names:
            name = names[id(mod.weight)]

            def hook(m: nn.Module, i: object, out: Tensor, name: str = name) -> None:
                channels = out.shape[-1] if isinstance(m, nn.Linear) else out.shape[1]
                seen[name] = seen.get(name, 0.0) + out.numel() / channels  # batch of one

            hooks.append(mod.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(example.unsqueeze(0))
    finally:
        for h in hooks:
            h.remove()
    return {n: seen.get(n, 1.0) for n in maskable(model)}
