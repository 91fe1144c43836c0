"""Dropout with given masks: a client's masks drawn from its own generator, outside the step.

``nn.Dropout`` draws its mask from torch's global generator inside the forward pass. A batched
(vmapped) step cannot replay each client's draws that way, and a global generator is not a
client's replayable stream. So the local-training executors draw a step's masks *before* the
step, from the client's dropout generator (:attr:`fedcomm.seeding.Stream.DROPOUT` at ``(round,
client)``), layer after layer in the order the forward pass runs them, and the forward pass
multiplies by them (:func:`given`): the same draws on the sequential and the vectorized backend,
on any device, and after a resume.

A mask is boolean ``(rows, *shape)``: ``shape`` is an example's input shape for ``nn.Dropout``
(one draw per element) and ``(channels, 1, ...)`` for ``nn.Dropout1d/2d/3d`` (one per channel);
the layer computes ``x ⊙ mask / (1 - p)``, as ``F.dropout`` does, and nothing when it is not in
training mode. The alpha dropouts (SELU's) have another rule and are not supported
(:func:`unsupported`): their models train one client at a time.

Forward passes outside a step that measure rather than train (FedDST's regrowth gradient, FedBIAD's
local loss ``L^k``, GraSP's scores, FedAvg-MoG's member choice) run with dropout off
(:func:`disabled`): the whole network, no draw, the same value on both backends.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

PREFIX = "dropout::"  # the masks' keys: PREFIX + the index of the call in the forward pass
ELEMENTWISE = (nn.Dropout,)
CHANNELWISE = (nn.Dropout1d, nn.Dropout2d, nn.Dropout3d)
UNSUPPORTED = (nn.AlphaDropout, nn.FeatureAlphaDropout)


@dataclass(frozen=True)
class Site:
    """One call of a dropout layer in the forward pass."""

    name: str  # the module's name in the model
    p: float  # its drop probability
    shape: tuple[int, ...]  # an example's mask shape (see the module docstring)


_SITES: weakref.WeakKeyDictionary[nn.Module, dict[tuple[Any, ...], tuple[Site, ...]]] = (
    weakref.WeakKeyDictionary()
)


def layers(model: nn.Module) -> dict[str, nn.Module]:
    """The model's dropout layers with a mask rule here, by name."""
    return {n: m for n, m in model.named_modules() if isinstance(m, ELEMENTWISE + CHANNELWISE)}


def unsupported(model: nn.Module) -> str | None:
    """Why the model's dropout cannot take given masks (None: it can, or it has none)."""
    names = [n for n, m in model.named_modules() if isinstance(m, UNSUPPORTED)]
    if names:
        return f"its alpha dropout layers ({', '.join(names[:3])}) have no given-mask rule"
    return None


def sites(model: nn.Module, example: Tensor) -> tuple[Site, ...]:
    """The dropout calls of one forward pass of ``example`` ``(1, ...)``, in the order they run
    (a layer called twice is two sites). Probed once per model and example shape, in eval mode
    and without gradients (no state changes), then remembered."""
    found = layers(model)
    if not found:
        return ()
    key = (tuple(example.shape[1:]), example.dtype, tuple(found))
    known = _SITES.setdefault(model, {})
    if key in known:
        return known[key]
    calls: list[Site] = []
    names = {m: n for n, m in found.items()}

    def record(module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0]
        p = float(getattr(module, "p", 0.0))
        if isinstance(module, CHANNELWISE):
            shape = (int(x.shape[1]), *([1] * (x.dim() - 2)))
        else:
            shape = tuple(int(d) for d in x.shape[1:])
        calls.append(Site(names[module], p, shape))

    handles = [m.register_forward_pre_hook(record) for m in found.values()]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(example[:1])
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    known[key] = tuple(calls)
    return known[key]


def draw(plan: tuple[Site, ...], rows: int, generator: torch.Generator) -> dict[str, Tensor]:
    """A step's masks for a batch of ``rows`` examples, drawn from ``generator`` site after
    site (``bernoulli(1 - p)`` per entry; ``p = 0`` keeps all and ``p = 1`` drops all without
    drawing). Boolean, on the generator's device."""
    out: dict[str, Tensor] = {}
    for i, site in enumerate(plan):
        shape = (rows, *site.shape)
        if site.p <= 0.0 or site.p >= 1.0:
            out[f"{PREFIX}{i}"] = torch.full(shape, site.p <= 0.0, dtype=torch.bool)
            continue
        mask = torch.empty(shape, dtype=torch.bool, device=generator.device)
        out[f"{PREFIX}{i}"] = mask.bernoulli_(1.0 - site.p, generator=generator)
    return out


def kept_all(plan: tuple[Site, ...], rows: int) -> dict[str, Tensor]:
    """Masks that drop nothing (a batch's padding rows, a client without a step)."""
    return {
        f"{PREFIX}{i}": torch.ones((rows, *s.shape), dtype=torch.bool) for i, s in enumerate(plan)
    }


@contextmanager
def disabled(model: nn.Module) -> Iterator[None]:
    """Every dropout layer of ``model`` (alpha ones too) in eval mode inside: it draws nothing
    and keeps everything; the rest of the model keeps its mode."""
    found = [m for m in model.modules() if isinstance(m, ELEMENTWISE + CHANNELWISE + UNSUPPORTED)]
    modes = [m.training for m in found]
    for m in found:
        m.training = False
    try:
        yield
    finally:
        for m, mode in zip(found, modes, strict=True):
            m.training = mode


def split(frozen: Mapping[str, Tensor]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """``(masks, the rest)`` of a step's frozen tensors."""
    masks = {k: v for k, v in frozen.items() if k.startswith(PREFIX)}
    if not masks:
        return masks, dict(frozen)
    return masks, {k: v for k, v in frozen.items() if not k.startswith(PREFIX)}


@contextmanager
def given(model: nn.Module, masks: Mapping[str, Tensor]) -> Iterator[None]:
    """For the forward passes inside: the model's dropout layers multiply by ``masks`` (site
    after site, see :func:`sites`) instead of drawing. Nothing changes without masks."""
    if not masks:
        yield
        return
    found = layers(model)
    order = [masks[f"{PREFIX}{i}"] for i in range(len(masks))]
    calls = iter(order)

    def forward(module: nn.Module) -> Any:
        p = float(getattr(module, "p", 0.0))

        def run(x: Tensor) -> Tensor:
            mask = next(calls, None)
            if mask is None:
                raise RuntimeError(
                    f"dropout layer {names[module]!r} ran more often than the masks given "
                    f"({len(order)}): the forward pass differs from the one probed"
                )
            if not module.training:
                return x
            if p >= 1.0:
                return torch.zeros_like(x)
            return x * mask * (1.0 / (1.0 - p))

        return run

    names = {m: n for n, m in found.items()}
    for m in found.values():
        m.forward = forward(m)
    try:
        yield
    finally:
        for m in found.values():
            del m.forward
