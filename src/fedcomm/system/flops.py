"""Local work in FLOPs: what a client's compute time is made of.

The model's forward FLOPs per example are counted once per model, per weight tensor, by forward
hooks on one example: a ``Linear`` costs ``2 · in · out`` per output row, a convolution
``2 · (in / groups) · kh · kw`` per output element, an LSTM layer ``2 · 4 · hidden · (in +
hidden)`` per time step; other modules (activations, pooling, norms, embeddings' lookups) are
left out (a few percent of a convolution's or a matrix product's). Training one example costs
3x its forward pass (the backward pass is about twice the forward).

A client is charged for the layers it actually computes. For an algorithm whose clients train a
masked model or a sub-model (``FedAlgorithm.execution.sparse_compute``): each weight's FLOPs times
the fraction of that weight that is nonzero in the model the client trained. A masked sparse model
(FedDST, RandomMask, PruneFL, GraSP) costs its density, the FLOPs sparse kernels would execute; a
sub-model whose dropped units are zero (FedDrop, AFD, FedMP, HeteroFL, FjORD, FedBIAD) costs its
kept part. A weight absent from the trained model, such as a progressive model's later stages,
costs nothing. Every other algorithm is charged its weights whole, without a pass over them:
FedSparse's and FedL1's clients train the dense model (their zeros come from the server's pruning
or thresholding).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor, nn

TRAIN_OVER_FORWARD = 3.0


WeightCost = dict[str, tuple[float, int]]  # weight name -> (forward FLOPs of one example, numel)


def forward_flops(model: nn.Module, example: Tensor) -> WeightCost:
    """Forward FLOPs of one example and the size, per weight name (``"conv1.weight"``);
    ``example`` is one input with its batch dimension (shape ``[1, ...]``)."""
    out: dict[str, float] = {}
    hooks = []

    def hook(name: str, module: nn.Module):  # type: ignore[no-untyped-def]
        def at(weight: str) -> str:
            return f"{name}.{weight}" if name else weight

        def count(_m: nn.Module, inputs: tuple[Tensor, ...], output: object) -> None:
            x = inputs[0] if inputs else None
            y = output[0] if isinstance(output, tuple) else output
            if isinstance(module, nn.Linear) and isinstance(y, Tensor):
                flops = 2.0 * module.in_features * y.numel()
                out[at("weight")] = out.get(at("weight"), 0.0) + flops
            elif isinstance(module, nn.modules.conv._ConvNd) and isinstance(y, Tensor):
                k = module.in_channels // module.groups * math.prod(module.kernel_size)
                out[at("weight")] = out.get(at("weight"), 0.0) + 2.0 * k * y.numel()
            elif isinstance(module, nn.LSTM) and isinstance(x, Tensor):
                steps = x.shape[0 if not module.batch_first else 1] if x.dim() == 3 else 1
                h = module.hidden_size
                for layer in range(module.num_layers):  # 4 gates, input and recurrent products
                    width = module.input_size if layer == 0 else h
                    out[at(f"weight_ih_l{layer}")] = 2.0 * 4 * h * width * steps
                    out[at(f"weight_hh_l{layer}")] = 2.0 * 4 * h * h * steps

        return count

    for name, module in model.named_modules():
        if isinstance(module, nn.Linear | nn.modules.conv._ConvNd | nn.LSTM):
            hooks.append(module.register_forward_hook(hook(name, module)))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(example)
    finally:
        model.train(was_training)
        for handle in hooks:
            handle.remove()
    # a weight used under several names (a decoder tied to the embedding) is counted under the
    # name named_parameters() keeps for it, once per use
    canonical = {id(p): name for name, p in model.named_parameters()}
    names = {n: canonical[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}
    sizes = {name: p.numel() for name, p in model.named_parameters()}
    cost: WeightCost = {}
    for name, flops in out.items():
        if name in names:
            key = names[name]
            cost[key] = (cost.get(key, (0.0, 0))[0] + flops, sizes[key])
    return cost


def example_flops(cost: WeightCost, trained: Mapping[str, Tensor | int], *, sparse: bool) -> float:
    """Training FLOPs of one example for a client that trained ``trained`` (its local model's
    tensors, or their nonzero counts: a client another rank trained): each weight's forward
    FLOPs, times 3; a weight absent from ``trained`` while others are present costs nothing.
    ``sparse`` (an algorithm that trains a masked model or a sub-model): each weight's FLOPs times
    its nonzero entries over the full weight's size (a smaller sub-model's tensor counts its
    size); else the weights are charged whole, without a pass over them."""
    if not any(name in trained for name in cost):  # another layout: charged dense
        return TRAIN_OVER_FORWARD * sum(flops for flops, _ in cost.values())
    total = 0.0
    for name, (flops, numel) in cost.items():
        w = trained.get(name)
        if w is not None and numel:
            total += flops * (_nonzero(w) / numel if sparse else 1.0)
    return TRAIN_OVER_FORWARD * total


def _nonzero(w: Tensor | int) -> int:
    return w if isinstance(w, int) else int(torch.count_nonzero(w))
