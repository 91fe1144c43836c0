"""LSTM language model (``lstm``): Embedding -> stacked LSTM -> Linear decoder.

Two uses in fedcomm's papers:

- Word-level LM (FedBIAD, Xue et al., IPDPS 2023, PTB / WikiText-2 / Reddit): ``embed_dim=300,
  hidden=300, num_layers=2``, untied, ``output="sequence"``. With a 10k vocabulary this is
  7,454,800 parameters (29.8 MB in fp32), matching the paper.
- Next-character classification (LEAF Shakespeare; Caldas et al., "LEAF: A Benchmark for
  Federated Settings", 2018): ``embed_dim=8, hidden=256, num_layers=2, output="last"``.

The recurrent layer is :class:`GateLSTM`, an ``nn.LSTM`` (same parameters, names, init, and
by default the same fused kernel, so sequential runs are unchanged) that can also run as
explicit gate maths over ``nn.Linear``-style matmuls. ``torch.func.vmap`` has no batching rule
for the fused ``aten::lstm``, so the vectorized backend switches every ``GateLSTM`` to the gate
form (:func:`unrolled`) and batches LSTM clients like any other model.

Initialisation follows PyTorch's ``word_language_model`` example (Zaremba et al., "Recurrent
Neural Network Regularization", 2014): embedding and decoder weights U(-0.1, 0.1), decoder bias
0; the LSTM keeps PyTorch's default U(-1/sqrt(H), 1/sqrt(H)).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch
from torch import nn

from fedcomm.models.registry import invalid_option, positive_int, register

Output = Literal["sequence", "last"]

INIT_RANGE = 0.1


class GateLSTM(nn.LSTM):
    """A unidirectional, batch-first ``nn.LSTM`` without dropout or projections, with a second
    form of the same function that ``vmap`` batches: per layer ``k`` and step ``t``

        z_t = x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh        # (B, 4H), gates (i, f, g, o)
        c_t = sigmoid(f) * c_{t-1} + sigmoid(i) * tanh(g)      # (B, H)
        h_t = sigmoid(o) * tanh(c_t)                           # (B, H), h_0 = c_0 = 0

    (PyTorch's ``nn.LSTM`` equations.) ``unrolled = False`` (default) calls the fused kernel,
    bit-identical to ``nn.LSTM``; ``True`` computes the equations above, equal up to float
    rounding (tested), with ``x W_ih^T`` for all steps as one matmul.
    """

    def __init__(self, input_size: int, hidden_size: int, num_layers: int) -> None:
        super().__init__(input_size, hidden_size, num_layers, batch_first=True)
        self.unrolled = False

    def forward(  # type: ignore[override]
        self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        if not self.unrolled:
            out, state = super().forward(x, hx)
            return out, state
        if hx is not None:
            raise ValueError("GateLSTM.unrolled starts from a zero state (hx must be None)")
        H = self.hidden_size
        h_last, c_last = [], []
        for k in range(self.num_layers):
            w_ih, w_hh = getattr(self, f"weight_ih_l{k}"), getattr(self, f"weight_hh_l{k}")
            bias = getattr(self, f"bias_ih_l{k}") + getattr(self, f"bias_hh_l{k}")
            zx = x @ w_ih.T + bias  # (B, T, 4H): the input's part of every step at once
            h = c = zx.new_zeros((*zx.shape[:-2], H))  # (B, H)
            outs = []
            for t in range(zx.shape[-2]):
                i, f, g, o = (zx[..., t, :] + h @ w_hh.T).chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outs.append(h)
            x = torch.stack(outs, dim=-2)  # (B, T, H): the next layer's input
            h_last.append(h)
            c_last.append(c)
        return x, (torch.stack(h_last), torch.stack(c_last))


@contextmanager
def unrolled(model: nn.Module) -> Iterator[None]:
    """Run every :class:`GateLSTM` of ``model`` in its gate form inside the block (vmap)."""
    cells = [m for m in model.modules() if isinstance(m, GateLSTM)]
    before = [m.unrolled for m in cells]
    for m in cells:
        m.unrolled = True
    try:
        yield
    finally:
        for m, b in zip(cells, before, strict=True):
            m.unrolled = b


class LSTMLanguageModel(nn.Module):
    """Modules ``embedding``, ``lstm`` (batch first) and ``decoder``, registered in that order."""

    def __init__(
        self,
        vocab_size: int,
        *,
        embed_dim: int,
        hidden: int,
        num_layers: int,
        tie_weights: bool,
        output: Output,
    ) -> None:
        super().__init__()
        self.output = output
        self.embedding = nn.Embedding(vocab_size, embed_dim)
        self.lstm = GateLSTM(embed_dim, hidden, num_layers)
        self.decoder = nn.Linear(hidden, vocab_size)
        nn.init.uniform_(self.embedding.weight, -INIT_RANGE, INIT_RANGE)
        nn.init.uniform_(self.decoder.weight, -INIT_RANGE, INIT_RANGE)
        nn.init.zeros_(self.decoder.bias)
        if tie_weights:  # Press & Wolf, EACL 2017; the parameter is named embedding.weight
            self.decoder.weight = self.embedding.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)  # (B, T, E)
        h, _ = self.lstm(x)  # (B, T, H)
        if self.output == "last":
            h = h[:, -1]  # (B, H)
        return self.decoder(h)  # (B, T, V) or (B, V)


@register("lstm")
def lstm(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    embed_dim: int = 300,
    hidden: int = 300,
    num_layers: int = 2,
    tie_weights: bool = False,
    output: Output = "sequence",
) -> LSTMLanguageModel:
    """LSTM language model over token ids; the vocabulary size is ``num_classes``.

    Input ``(B, T)`` int64 token ids. Output logits ``(B, T, V)`` for ``output="sequence"``
    (one next-token prediction per position) or ``(B, V)`` for ``output="last"`` (the next
    token after the window, LEAF style). No dropout, so training needs no extra randomness.

    Args:
        input_shape: ``(T,)``, the sequence length (any T works at run time).
        num_classes: vocabulary size V.
        embed_dim: embedding width E.
        hidden: LSTM hidden size H.
        num_layers: stacked LSTM layers.
        tie_weights: share the decoder weight with the embedding (needs ``hidden == embed_dim``).
        output: ``"sequence"`` or ``"last"``, see above.

    Returns:
        The model.
    """
    if len(input_shape) != 1:
        raise invalid_option("lstm", "input_shape", f"must be (T,), got {input_shape}")
    for option, value in (("embed_dim", embed_dim), ("hidden", hidden), ("num_layers", num_layers)):
        positive_int("lstm", option, value)
    if output not in ("sequence", "last"):
        raise invalid_option("lstm", "output", f"must be 'sequence' or 'last', got {output!r}")
    if not isinstance(tie_weights, bool):
        raise invalid_option("lstm", "tie_weights", f"must be a bool, got {tie_weights!r}")
    if tie_weights and hidden != embed_dim:
        raise invalid_option(
            "lstm", "tie_weights", f"needs hidden == embed_dim, got {hidden} != {embed_dim}"
        )
    return LSTMLanguageModel(
        num_classes,
        embed_dim=embed_dim,
        hidden=hidden,
        num_layers=num_layers,
        tie_weights=tie_weights,
        output=output,
    )
