"""``data``: which dataset (a discriminated union on ``name``) and where its files are."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from fedcomm.config.base import Strict

VERIFY: Any = Field(  # the `verify` key of the datasets with a standard release
    True,
    description="check the files against the standard release's MD5 digests (false: your "
    "own copy); checks only, the data read is the same",
)


class Standardize(Strict):
    """Per-channel standardization ``(x − mean_c) / std_c`` of images scaled to [0, 1]
    (torchvision's ``Normalize``): one number per channel, every std > 0."""

    mean: list[float] = Field(min_length=1)
    std: list[Annotated[float, Field(gt=0)]] = Field(min_length=1)

    @model_validator(mode="after")
    def _same_length(self) -> Standardize:
        if len(self.mean) != len(self.std):
            raise ValueError(
                f"mean has {len(self.mean)} channels, std {len(self.std)}: give one of each "
                "per channel"
            )
        return self


NORMALIZE: Any = Field(
    None,
    description="standardize each channel: {mean: [...], std: [...]} (e.g. the official FedDST "
    "code's CIFAR-10 Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010))); null: "
    "pixels in [0, 1]",
)


class Digits(Strict):
    name: Literal["digits"] = "digits"


class Mnist(Strict):
    name: Literal["mnist", "fashion_mnist"]
    normalize: bool = False
    verify: bool = VERIFY


class Femnist(Strict):
    name: Literal["femnist"] = "femnist"
    invert: bool = False


class Shakespeare(Strict):
    name: Literal["shakespeare"] = "shakespeare"
    target: Literal["next_char", "next_word"] = "next_char"
    seq_len: int | None = Field(None, ge=1)
    stride: int | None = Field(None, ge=1)
    max_roles: int | None = Field(None, ge=1)
    min_samples: int = Field(2, ge=1)
    vocab_size: int = Field(10000, ge=3)


class Ptb(Strict):
    name: Literal["ptb"] = "ptb"
    seq_len: int = Field(35, ge=1)
    verify: bool = VERIFY


class Cifar10(Strict):
    name: Literal["cifar10"] = "cifar10"
    verify: bool = VERIFY
    normalize: Standardize | None = NORMALIZE


class Cifar100(Strict):
    name: Literal["cifar100"] = "cifar100"
    label: Literal["fine", "coarse"] = "fine"
    verify: bool = VERIFY
    normalize: Standardize | None = NORMALIZE


class ImageFolder(Strict):
    """Any dataset in torchvision's ImageFolder layout: ``<path>/{train,test}/<class>/<image>``
    under the data root, decoded once and cached by content
    (``fedcomm.data.datasets.image_folder``)."""

    name: Literal["image_folder"] = "image_folder"
    path: str = Field(
        min_length=1,
        description="the dataset's folder, relative to the data root (e.g. cifar10_jpeg)",
    )
    mode: Literal["RGB", "L", "RGBA"] = Field(
        "RGB", description="every image must have this Pillow mode (no conversion)"
    )
    size: tuple[Annotated[int, Field(ge=1)], Annotated[int, Field(ge=1)]] | None = Field(
        None,
        description="[height, width] every image must have (no resizing); null: the first's",
    )
    verify: bool = VERIFY
    cache: bool = Field(
        True,
        description="keep the decoded images in $FEDCOMM_CACHE_DIR (else ~/.cache/fedcomm), "
        "keyed by the files' content; false: decode on every load",
    )
    normalize: Standardize | None = NORMALIZE

    @field_validator("path")
    @classmethod
    def _relative(cls, v: str) -> str:
        parts = v.replace("\\", "/").split("/")
        if v.startswith(("/", "\\", "~")) or ".." in parts or (len(v) > 1 and v[1] == ":"):
            raise ValueError(
                "must be a folder relative to the data root; set data.root to the folder above it"
            )
        return v


class Synthetic(Strict):
    name: Literal["synthetic"] = "synthetic"
    alpha: float = Field(0.0, ge=0)
    beta: float = Field(0.0, ge=0)
    num_users: int = Field(30, ge=1)
    dim: int = Field(60, ge=1)
    num_classes: int = Field(10, ge=2)
    iid: bool = False
    seed: int = Field(0, ge=0)
    min_samples: int = Field(50, ge=1)


DatasetConfig = Annotated[
    Digits | Mnist | Femnist | Shakespeare | Ptb | Cifar10 | Cifar100 | ImageFolder | Synthetic,
    Field(discriminator="name"),
]


class DataConfig(Strict):
    """``data``: which dataset, and where its files are (``root``; else ``$FEDCOMM_DATA_ROOT``)."""

    root: str | None = None
    dataset: DatasetConfig = Field(default_factory=Digits)

    def options(self) -> dict[str, Any]:
        return self.dataset.model_dump(exclude={"name"})
