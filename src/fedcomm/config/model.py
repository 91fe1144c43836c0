"""``model``: the network (a discriminated union on ``name``, one config per model of
``fedcomm.models.registry``, whose options are its keys)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from fedcomm.config.base import Strict


class MlpModel(Strict):
    name: Literal["mlp"] = "mlp"
    hidden: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [200, 200])


class CnnModel(Strict):
    """``cnn``: FedSparse's LeNet-5 (no padding); ``mnist_cnn``: the FedAvg paper's CNN."""

    name: Literal["cnn", "mnist_cnn"] = "cnn"
    channels: list[Annotated[int, Field(ge=1)]] = Field(default_factory=lambda: [32, 64])
    hidden: int = Field(512, ge=1)


class FeddstCnnModel(Strict):
    """FedDST's CNNs. ``channels``/``hidden`` null (the default) = the paper's net for the data's
    input: MNIST (1x28x28) -> ``[10, 20]``/``[50]``, 261,840 parameters; CIFAR-10 (3x32x32) ->
    ``[6, 16]``/``[120, 84]``, 782,006; CIFAR-100 -> ``[6, 16]``/``[120]``, 783,092. Other
    1-channel data gets the MNIST widths, other colour data the CIFAR-10 ones
    (``fedcomm.models.vision.feddst_widths``). A value given is used as is."""

    name: Literal["feddst_cnn"] = "feddst_cnn"
    channels: list[Annotated[int, Field(ge=1)]] | None = Field(
        None,
        min_length=2,
        max_length=2,
        description="the two convolutions' output channels; null: the paper's for the input",
    )
    hidden: list[Annotated[int, Field(ge=1)]] | None = Field(
        None, description="hidden fully connected widths (may be []); null: the paper's"
    )
    softmax_output: bool = Field(
        False,
        description="end in softmax, as the official code's nets do (its cross-entropy then "
        "applies log-softmax again: the 'double softmax'); false: logits",
    )


class ResNetModel(Strict):
    name: Literal["resnet20"] = "resnet20"
    groups: int = Field(2, ge=1, description="GroupNorm groups")
    shortcut: Literal["A", "B"] = Field("B", description="A: zero-pad (no params), B: 1x1 conv")


class ResNet18Model(Strict):
    """``resnet18``: CIFAR ResNet-18 with GroupNorm (ProgFed's CIFAR-100 model)."""

    name: Literal["resnet18"] = "resnet18"
    groups: int = Field(2, ge=1, description="GroupNorm groups")


class ProgfedEmnistCnnModel(Strict):
    name: Literal["progfed_emnist_cnn"] = "progfed_emnist_cnn"
    dropout: bool = Field(True, description="Dropout 0.25 after the convs, 0.5 after fc1")


class ProgfedCifarCnnModel(Strict):
    name: Literal["progfed_cifar_cnn"] = "progfed_cifar_cnn"


class LstmModel(Strict):
    name: Literal["lstm"] = "lstm"
    embed_dim: int = Field(300, ge=1)
    hidden: int = Field(300, ge=1)
    num_layers: int = Field(2, ge=1)
    tie_weights: bool = False
    output: Literal["sequence", "last"] = "sequence"


ModelConfig = Annotated[
    MlpModel
    | CnnModel
    | FeddstCnnModel
    | ResNetModel
    | ResNet18Model
    | ProgfedEmnistCnnModel
    | ProgfedCifarCnnModel
    | LstmModel,
    Field(discriminator="name"),
]


def model_options(cfg: BaseModel) -> dict[str, Any]:
    return cfg.model_dump(exclude={"name"})
