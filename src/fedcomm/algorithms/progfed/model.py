"""ProgFed's model side: the progressive net with its temporary heads (eq. 1-2, built by
:class:`fedcomm.models.progressive.ProgressiveNet`), and which of its parameters a round sends
and trains."""

from __future__ import annotations

from torch import nn

from fedcomm.algorithms.progfed.schedule import Phase
from fedcomm.models.progressive import ProgressiveNet, is_staged
from fedcomm.seeding import Stream, torch_generator

STAGED_MODELS = "mlp, cnn, mnist_cnn, resnet20, resnet18, progfed_emnist_cnn, progfed_cifar_cnn"


def as_net(model: nn.Module | None) -> ProgressiveNet:
    """``model`` as the progressive net ProgFed trains (``prepare_model``'s output)."""
    if not isinstance(model, ProgressiveNet):
        raise TypeError("progfed runs on the ProgressiveNet built by its prepare_model")
    return model


def num_classes(model: nn.Module) -> int:
    """Output width of a staged model's classifier (its last 2-D weight)."""
    prefixes = getattr(model, "classifier_prefixes", ())
    weights = [
        p for n, p in model.named_parameters() if n.startswith(tuple(prefixes)) and p.ndim == 2
    ]
    if not weights:
        raise ValueError("progfed: the model's classifier has no 2-D weight")
    return int(weights[-1].shape[0])


def validate_model(model: nn.Module, stages: int) -> None:
    """Raises ValueError unless ``model`` has a stage split into ``stages`` stages."""
    if not is_staged(model):
        raise ValueError(
            f"progfed: model {type(model).__name__} has no stage split "
            f"(staged models: {STAGED_MODELS})"
        )
    try:
        model.stage_cuts(stages)  # type: ignore[operator]
    except ValueError as err:
        raise ValueError(f"progfed: stages={stages}: {err}") from None


def progressive_net(model: nn.Module, stages: int, seed: int) -> nn.Module:
    """The registry's ``model`` split into ``stages`` stages with temporary heads ``G_1 …
    G_{S−1}``, drawn from the run's algorithm stream (a progressive net is returned as is)."""
    if isinstance(model, ProgressiveNet):
        return model
    validate_model(model, stages)
    gen = torch_generator(seed, Stream.ALGORITHM, 0)  # the temporary heads' init
    return ProgressiveNet(model, stages, num_classes(model), gen)


def active(net: ProgressiveNet, ph: Phase) -> list[str]:
    """``M^s``: the parameters sent down (eq. 2, the current head included)."""
    return net.submodel_params(ph.stage)


def trained(net: ProgressiveNet, ph: Phase) -> list[str]:
    """The parameters trained and uploaded: ``M^s`` in a stage round, ``E_s + G_s`` in a
    warm-up round (``E_1 … E_{s−1}`` frozen; Algorithm 1, line 18)."""
    if ph.warmup:
        return [*net.block_params(ph.stage), *net.head_params(ph.stage)]
    return net.submodel_params(ph.stage)


def numel(net: ProgressiveNet, names: list[str]) -> int:
    """Number of scalar parameters among ``names``."""
    numels = {n: p.numel() for n, p in net.named_parameters()}
    return sum(numels[k] for k in names)


def stage_sizes(net: ProgressiveNet) -> tuple[list[int], list[int]]:
    """``(P_1 … P_S, |E_1| + |G_1| … |E_S| + |G_S|)``: each sub-model's size with its head,
    and what a warm-up round of each stage trains."""
    stages = range(1, net.stages + 1)
    submodel = [net.submodel_numel(s) for s in stages]
    new = [numel(net, trained(net, Phase(s, True, 1))) for s in stages]
    return submodel, new


def round_stats(net: ProgressiveNet, ph: Phase, factor: float) -> dict[str, float]:
    """Logged per round (``progfed/...``): the phase, the active sub-model's size with its
    head, the trained parameters, the sub-model's fraction of the full model, lr / η0."""
    size = net.submodel_numel(ph.stage)
    return {
        "stage": float(ph.stage),
        "warmup": float(ph.warmup),
        "scheduled_round": float(ph.t),
        "submodel_params": float(size),
        "trained_params": float(numel(net, trained(net, ph))),
        "submodel_fraction": size / net.dense_numel(),  # of the full model
        "lr_factor": factor,
    }
