"""``train.backend: auto``: the faster backend for this model on this device, by a documented rule.

The rule is keyed on what decides the speed, and on nothing measured at run time, so the same
config picks the same backend on every run, resume and seed (the two backends agree only to
float rounding, so a choice that changed with the host's load would change a run's numbers):

* **CPU, a model with convolutions** -> ``sequential``. On the CPU, ``vmap`` lowers the
  cohort's convolutions to grouped convolutions in the NCHW layout (it has no channels-last
  layout), while one client at a time runs oneDNN's channels-last convolutions and max pooling
  (``models.vision.channels_last``); measured, the sequential backend is the faster one: W3 of
  ``benchmarks/backends.py`` (3.7 against 5.5 CPU s/round) and the FedDST CIFAR-10 profile
  (FedDST 13.2 against 15.4, FedAvgM 12.0 against 14.0; ``docs/speed.md``).
* **CPU, a model with recurrent layers** (LSTM) -> ``sequential``: one client at a time runs
  the fused oneDNN LSTM kernel; batched, the LSTM runs its gate form one time step after
  another (vmap has no rule for the fused kernel), measured 2x the CPU time per client step on
  the PTB 2x300 LSTM, with about 0.5 GB of working memory per client (``docs/speed.md``).
* **CPU, any other model** (MLPs) -> ``vectorized``: the batched step wins where each client's
  step is small (W1: 2.2x faster than the sequential round).
* **an accelerator** (``cuda``, ``mps``) -> ``vectorized``: a step per client leaves a GPU
  mostly idle, and the batched step is written to keep it busy (nothing read back per step).
  This is the design's expectation; no GPU timing backs it yet (``docs/speed.md``).

Algorithms or models the vectorized backend cannot batch still fall back to sequential, with
their reason logged, as they do when ``vectorized`` is asked for by name.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger("fedcomm.backend")

_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_RECURRENT = (nn.RNNBase,)  # nn.LSTM (and fedcomm's GateLSTM), nn.GRU, nn.RNN


def choose(model: nn.Module, device: torch.device) -> tuple[str, str]:
    """The backend ``auto`` means for ``model`` on ``device``, and why (one sentence)."""
    if device.type != "cpu":
        return "vectorized", f"on {device.type} the batched step keeps the device busy"
    convs = sorted({type(m).__name__ for m in model.modules() if isinstance(m, _CONV)})
    if convs:
        return "sequential", (
            f"on the CPU a model with convolutions ({', '.join(convs)}) trains faster one client "
            "at a time in channels-last than as vmapped grouped convolutions"
        )
    rnns = sorted({type(m).__name__ for m in model.modules() if isinstance(m, _RECURRENT)})
    if rnns:
        return "sequential", (
            f"on the CPU a model with recurrent layers ({', '.join(rnns)}) trains faster one "
            "client at a time on the fused kernel than batched in its gate form"
        )
    return "vectorized", (
        "on the CPU a model without convolutions or recurrent layers trains faster batched"
    )


def resolve(name: str, model: nn.Module, device: torch.device) -> str:
    """``name`` itself, or for ``auto`` the rule's choice, logged in one line."""
    if name != "auto":
        return name
    chosen, why = choose(model, device)
    log.info("backend auto: %s (%s)", chosen, why)
    return chosen
