"""What a ProgFed round is charged, per client (Section 4.3; a514514772/ProgFed ``main.py``).

A stage round of stage ``s`` sends the dense active sub-model ``M^s`` down and the dense
update of it up (``P_s`` values each way, head included); a warm-up round sends ``M^s`` down
and the update of ``E_s + G_s`` up.

Warm-up charge (``warmup_charge``): ``sent`` (default) charges
exactly what a warm-up round sends, ``P_s`` down and ``|E_s| + |G_s|`` up. ``code_counter``
charges what the official code's counter books (``main.py``: inside the warm-up loop,
``cur_cost += |E_s| + |G_s|`` starts from the previous round's ``P_{s−1}`` and accumulates over
the W rounds, so warm-up round ``w = 1…W`` of stage ``s`` books
``c_w = P_{s−1} + w·(|E_s| + |G_s|)`` values per client), both ways: the message sent plus a
:class:`CounterCharge` entry of the difference, which carries nothing and is counted at 32 bits
per value (compressors pass it through uncompressed, so compare compressed runs as the paper
does: the float ratio times b/32 and p). That counter is where the paper's costs come from: with
the code's schedule it gives ProgFed's seven ResNet-18/CIFAR-100 costs of Table 12 to the GB
(S = 4, W = 25: 4,179 GB, 77.6% of dense end-to-end over T = 3000; Table 3 / 5 print 77.10%),
while ``sent`` gives 67.5% (66.6% without warm-up): the 25·26/2 = 325 copies of ``E_s + G_s``
it books per growth are not traffic, so ``sent`` stays the default.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from fedcomm.algorithms.progfed.schedule import Phase, warmup_index
from fedcomm.comm import bits
from fedcomm.comm.payload import BitCount, Payload

WarmupCharge = Literal["sent", "code_counter"]
COUNTER = "progfed/code_counter"  # payload key of the CounterCharge entry


def round_charge(
    ph: Phase, w: int, submodel: Sequence[int], new: Sequence[int], warmup_charge: WarmupCharge
) -> tuple[int, int]:
    """Values charged per client in one loop round, ``(down, up)``: ``(P_s, P_s)`` for a stage
    round; for warm-up round ``w`` of stage ``s``, ``(P_s, |E_s| + |G_s|)`` (``sent``) or
    ``(c_w, c_w)`` with ``c_w = P_{s−1} + w·(|E_s| + |G_s|)`` (``code_counter``)."""
    s = ph.stage
    if not ph.warmup:
        return submodel[s - 1], submodel[s - 1]
    if warmup_charge == "sent":
        return submodel[s - 1], new[s - 1]
    c = submodel[s - 2] + w * new[s - 1]
    return c, c


def charged_values(
    phases: Sequence[Phase],
    submodel: Sequence[int],
    new: Sequence[int],
    warmup_charge: WarmupCharge,
) -> list[tuple[int, int]]:
    """Values charged per client in each loop round, ``(down, up)`` (:func:`round_charge`).

    Args:
        phases: the loop rounds (:func:`~fedcomm.algorithms.progfed.schedule.schedule`).
        submodel: ``P_1 … P_S``, the sub-models' sizes with their heads.
        new: ``|E_s| + |G_s|`` for ``s = 1 … S`` (what a warm-up round of stage ``s`` trains).
        warmup_charge: ``sent`` or ``code_counter`` (see the module docstring).
    """
    return [
        round_charge(ph, w, submodel, new, warmup_charge)
        for ph, w in zip(phases, warmup_index(phases), strict=True)
    ]


def counter_extra(
    ph: Phase, w: int, submodel: Sequence[int], new: Sequence[int], warmup_charge: WarmupCharge
) -> tuple[int, int]:
    """``(down, up)`` values the code's counter books beyond the messages sent: 0 unless
    ``warmup_charge: code_counter`` in a warm-up round."""
    if warmup_charge == "sent" or not ph.warmup:
        return 0, 0
    booked = round_charge(ph, w, submodel, new, "code_counter")
    sent = round_charge(ph, w, submodel, new, "sent")
    return booked[0] - sent[0], booked[1] - sent[1]


@dataclass(frozen=True)
class CounterCharge:
    """``numel`` values the official code's warm-up counter books beyond what is sent: counted
    at 32 bits each (the code's 4 bytes), carrying nothing (decodes to an empty tensor)."""

    numel: int

    def decode(self) -> Tensor:
        return torch.zeros(0, device="cpu")

    def nbits(self) -> BitCount:
        return BitCount(payload=bits.dense(self.numel))

    def dense_bits(self) -> int:
        return bits.dense(self.numel)


def with_counter(payload: Payload, numel: int) -> Payload:
    """``payload`` plus a :class:`CounterCharge` of ``numel`` values (unchanged if none)."""
    if numel <= 0:
        return payload
    return Payload({**payload.entries, COUNTER: CounterCharge(numel)})


def without_counter(tensors: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """A decoded message without its :class:`CounterCharge` entry (the tensors it carries)."""
    return {k: v for k, v in tensors.items() if k != COUNTER}
