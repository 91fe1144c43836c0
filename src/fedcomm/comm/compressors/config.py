"""Typed configs of the uplink compressors (``train.compressor`` and per-run ``uplink``).

A discriminated union on ``name``; a compressor's options are every field but ``name``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NoCompressor(Strict):
    """``none``: the uplink is sent as the algorithm encoded it."""

    name: Literal["none"] = "none"


class DgcCompressor(Strict):
    """``dgc``: top-k with residuals and a density warm-up (:mod:`fedcomm.comm.compressors.dgc`)."""

    name: Literal["dgc"] = "dgc"
    density: float = Field(0.001, gt=0, le=1, description="kept fraction after the warm-up")
    warmup_rounds: int = Field(4, ge=0, description="rounds of density max(density, 0.25**r)")
    index_bits: int = Field(64, ge=1, description="bits per position (FedBIAD counts 64)")
    scope: Literal["tensor", "model"] = Field(
        "tensor", description="top-k per tensor, or one top-k over the whole update"
    )
    vectors: Literal["compress", "dense"] = Field(
        "compress", description="1-D parameters (biases) compressed, or sent dense (DGC's code)"
    )


class StcCompressor(Strict):
    """``stc``: sparse ternary with residuals (:mod:`fedcomm.comm.compressors.stc`)."""

    name: Literal["stc"] = "stc"
    density: float = Field(1 / 400, gt=0, le=1, description="kept fraction")
    index_bits: int = Field(64, ge=1, description="bits per position (FedBIAD counts 64)")


class SignSgdCompressor(Strict):
    """``signsgd``: signs up, majority vote at the server (use ``server: {optimizer: sgd, lr:
    η_s}``; :mod:`fedcomm.comm.compressors.signsgd`)."""

    name: Literal["signsgd"] = "signsgd"
    scale: bool = Field(False, description="also send mean |Δ| per tensor (+32 bits)")


class FedPaqCompressor(Strict):
    """``fedpaq``: unbiased stochastic quantisation (:mod:`fedcomm.comm.compressors.fedpaq`)."""

    name: Literal["fedpaq"] = "fedpaq"
    levels: int = Field(127, ge=1, description="magnitude levels s (127: 8 bits with the sign)")


Rotation = Literal["truncated", "padded", "none"]
_ROTATION = (
    "random Hadamard rotation of dim 0 before quantising: truncated (the official ProgFed code), "
    "padded (zero rows up to 2^k, orthonormal; padded entries are sent) or none"
)


class LqCompressor(Strict):
    """``lq``: ProgFed's LQ-b, linear stochastic quantisation after a random rotation
    (:mod:`fedcomm.comm.compressors.lq`)."""

    name: Literal["lq"] = "lq"
    bits: int = Field(8, ge=1, le=8, description="bits b per quantised entry (uint8 levels)")
    rotation: Rotation = Field("truncated", description=_ROTATION)


class SpCompressor(Strict):
    """``sp``: ProgFed's SP-p, a seeded random Bernoulli(keep) mask rescaled by 1/keep
    (:mod:`fedcomm.comm.compressors.sp`)."""

    name: Literal["sp"] = "sp"
    keep: float = Field(0.1, gt=0, le=1, description="probability p of keeping each value")
    bits: int | None = Field(
        None, ge=1, le=8, description="LQ-b of the kept values (None: fp32; 8: LQ8+SP)"
    )
    rotation: Rotation = Field("truncated", description=_ROTATION + " (used only with bits)")


# Uplink compressor wrapping every algorithm's uplink; options = every field but ``name``.
CompressorConfig = Annotated[
    NoCompressor
    | DgcCompressor
    | StcCompressor
    | SignSgdCompressor
    | FedPaqCompressor
    | LqCompressor
    | SpCompressor,
    Field(discriminator="name"),
]
