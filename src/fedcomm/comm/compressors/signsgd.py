"""SignSGD with majority vote: each client sends the signs of its update, the server the sign of
their sum.

Bernstein et al., "signSGD: Compressed Optimisation for Non-Convex Problems", ICML 2018
(arXiv:1802.04434); majority vote as in "signSGD with Majority Vote is Communication Efficient
and Fault Tolerant", ICLR 2019 (arXiv:1810.05291).

Client: ``sign(Δ_k)``, one bit per value; a bit cannot say 0, so ``sign(0)`` is a fair coin
from the client's generator (no drift of never-updated weights). With ``scale=True``
it also sends ``s_k = mean |Δ_k|`` per entry (+32 bits), and decodes to ``s_k · sign(Δ_k)``.
Server (:func:`majority_vote`, the compressor's ``server_hook``): every client's update is
replaced by ``V = sign(Σ_k sign(Δ_k))`` (ties give 0), times ``mean_k s_k`` with a scale, so
any averaging algorithm then steps exactly ``U ← U + η_s · V``. Use it with a full-model-delta
algorithm (``fedavg``/``fedprox``) and ``server: {optimizer: sgd, lr: η_s}`` (η_s is the server
learning rate to tune; the weighting is irrelevant since all uplinks are equal). The vote needs
the clients' entries aligned value by value: uplinks whose kept sets differ (FedDrop's flat kept
values) are not meaningful to vote on.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from fedcomm.comm.codecs import Compressor, register_compressor
from fedcomm.comm.compressors._common import map_updates
from fedcomm.comm.compressors._entries import Signs
from fedcomm.comm.payload import Payload


def majority_vote(payloads: Sequence[Payload]) -> list[dict[str, Tensor]]:
    """Each payload decoded, with every :class:`Signs` entry replaced by the cohort's vote."""
    decoded = [p.decode() for p in payloads]
    if not payloads:
        return decoded
    names = [k for k, e in payloads[0].items() if isinstance(e, Signs)]
    for name in names:
        entries = [p.get(name) for p in payloads]
        signs = [e for e in entries if isinstance(e, Signs)]
        if len(signs) != len(entries) or len({e.signs.shape for e in signs}) != 1:
            raise ValueError(f"signsgd: entry {name!r} is not a same-shape sign vector everywhere")
        votes = sum(e.signs.to(torch.int32) * 2 - 1 for e in signs)  # Σ_k ±1, int32
        vote = torch.sign(torch.as_tensor(votes, device=signs[0].signs.device)).to(signs[0].dtype)
        scales = [e.scale for e in signs if e.scale is not None]
        if scales:
            vote = vote * torch.stack(scales).mean().to(vote.dtype)
        for d in decoded:
            d[name] = vote
    return decoded


@register_compressor("signsgd")
def signsgd(scale: bool = False) -> Compressor:
    """One sign bit per value (+ a 32-bit mean-|Δ| scale per entry); server-side majority vote."""

    def encode(
        payload: Payload, state: None, generator: torch.Generator, round_: int
    ) -> tuple[Payload, None]:
        def one(name: str, values: Tensor) -> Signs:
            # used where Δ_i = 0; drawn on the generator's device (CPU), then moved
            coin = torch.rand(values.shape, generator=generator, device=generator.device) < 0.5
            coin = coin.to(values.device)
            positive = torch.where(values == 0, coin, values > 0)
            s = values.abs().mean() if scale and values.numel() else None
            return Signs(positive, s, values.dtype)  # numel bits (+32)

        return map_updates(payload, one), state

    return Compressor("signsgd", init=lambda: None, encode=encode, server_hook=majority_vote)
