"""FedDST's messages and what they cost (the official code's count, bibikar/feddst ``dst.py``;
layout: :mod:`fedcomm.algorithms.sparse`).

``N_m`` maskable weights, ``B`` bias/other entries, 32-bit values:

* down: ``32·d·N_m + 32·B`` (active global values + biases), plus ``N_m`` mask bits iff the
  client's mask (a digest in its state; all ones before its first participation) differs from
  the global mask. Round 1's values are ``Free`` (``free_initial_download``: ``θ_0`` is a seed);
* up: ``32·d_k·N_m + 32·B``, plus the mask in rounds the client readjusted: ``N_m`` bits
  (``upload_mask: sent``) or ``d_k·N_m`` bits (``kept``, the code's count).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import Tensor

from fedcomm.algorithms.sparse import codec as _codec
from fedcomm.comm.payload import Payload


def mask_charge(
    client_digest: str | None, ones_digest: str, global_digest: str
) -> _codec.MaskCharge:
    """``known`` when the client's mask (all ones before its first round) is the global one."""
    return "known" if (client_digest or ones_digest) == global_digest else "sent"


@dataclass
class Downlinks:
    """The downlinks already encoded for one server state: the same for every client with the
    same mask knowledge, so encoded once per state and kind, not per client."""

    state: object | None = None
    payloads: dict[tuple[str, bool], Payload] = field(default_factory=dict)

    def get(
        self,
        state: object,
        params: Mapping[str, Tensor],
        masks: Mapping[str, Tensor],
        charge: _codec.MaskCharge,
        free: bool,
    ) -> Payload:
        """``θ ⊙ m`` of ``state`` with its masks charged per ``charge``; ``free``: values cost
        nothing."""
        if self.state is not state:
            self.state, self.payloads = state, {}
        if (charge, free) not in self.payloads:
            self.payloads[(charge, free)] = _codec.encode(params, masks, charge, free_values=free)
        return self.payloads[(charge, free)]
