"""``train``: the round loop shared by every algorithm of the experiment. Its sub-sections'
schemas live beside the code that runs them: ``train.local`` in the local step
(``LocalConfig``), ``train.compressor`` in ``fedcomm.comm.compressors.config`` and
``train.system`` in ``fedcomm.system.config``."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator

from fedcomm.algorithms.core.local import LocalConfig
from fedcomm.comm.compressors.config import CompressorConfig, NoCompressor
from fedcomm.config.base import Strict
from fedcomm.simulation.device import DEVICE_PATTERN
from fedcomm.system.config import SystemConfig


class TrainConfig(Strict):
    """``train``: the round loop shared by every algorithm of the experiment."""

    rounds: int = Field(ge=1)
    clients_per_round: int = Field(ge=1)
    local: LocalConfig = Field(default_factory=LocalConfig)
    backend: Literal["sequential", "vectorized", "auto"] = Field(
        "sequential",
        description="sequential: one client after the other (the reference); vectorized: the "
        "round's clients train as one batched computation (torch.func.vmap), falling back to "
        "sequential, with a log line saying why, for algorithms or models it cannot batch; "
        "auto: the faster of the two for the model and device, by a fixed rule (on the CPU, "
        "sequential for models with convolutions or recurrent layers, else vectorized; "
        "vectorized on a GPU), logged in one line (fedcomm.simulation.auto_backend, "
        "docs/speed.md)",
    )
    chunk_size: int | Literal["auto"] = Field(
        128,
        description="vectorized: clients per batched computation (bounds memory); auto: as "
        "many as fit in the device's free memory (see docs/speed.md)",
    )
    compile: Literal[
        "none", "inductor", "reduce-overhead", "max-autotune", "cudagraphs", "aot_eager"
    ] = Field(
        "none",
        description="vectorized: torch.compile of the batched local step, once per run: none "
        "(eager), inductor (generated kernels), reduce-overhead (the same as CUDA graphs: one "
        "launch a step, for launch-bound GPU rounds), max-autotune, cudagraphs (CUDA graphs of "
        "the eager kernels), aot_eager (traced, eager kernels: a check); the first steps pay "
        "the compilation (docs/speed.md)",
    )
    device: str = Field(
        "auto",
        description="where the model, the clients' data, training and evaluation live: auto "
        "(cuda if available, else cpu), cpu, cuda, cuda:N or mps; a device this machine lacks "
        "is an error before any work",
    )
    nproc: int = Field(
        1,
        ge=1,
        description="processes one run trains on (torchrun, one per GPU on CUDA): each round's "
        "clients are split over them and gathered, rank 0 evaluates and writes; the same "
        "numbers as one process (bit for bit on the sequential backend, see docs/speed.md), so "
        "it is not part of the run's identity and a checkpoint resumes with any number",
    )
    precision: Literal["fp32", "bf16", "fp16"] = Field(
        "fp32",
        description="local training's forward and backward: fp32, or autocast to bf16/fp16 "
        "(matmuls and convolutions; parameters, updates and evaluation stay fp32; fp16 has no "
        "loss scaling)",
    )
    eval_every: int = Field(
        1,
        ge=1,
        description="evaluate the global model every n rounds (and after the last); each "
        "distinct test example once, whatever the number of clients holding it",
    )
    local_eval_every: int = Field(
        1,
        ge=1,
        description="local accuracy (each client's last upload on its own test split) every n "
        "rounds (and after the last): 1 evaluates each upload at once; n > 1 keeps the uploads "
        "since the last time (up to n x clients_per_round models, in host memory) and evaluates "
        "each client's newest, reusing every other client's last result",
    )
    eval_batch_size: int = Field(2048, ge=1)
    topk: int = Field(1, ge=1, description="k of topk/accuracy (3 for next-word prediction)")
    checkpoint_every: int = Field(5, ge=1)
    compressor: CompressorConfig = Field(default_factory=NoCompressor)
    on_divergence: Literal["stop", "skip"] = Field(
        "stop",
        description="a client whose training loss is non-finite or above divergence_loss, or "
        "whose update is non-finite: stop the run (exit 2, MLflow run FAILED) or skip it",
    )
    divergence_loss: float = Field(1e6, gt=0, description="a training loss above this diverged")
    system: SystemConfig | None = Field(
        None,
        description="simulated client links, compute, availability and round policy "
        "(docs/system.md); absent: no simulated time, every number as without it. Under train, "
        "so that DVC reruns training when it changes",
    )

    @field_validator("chunk_size", mode="before")
    @classmethod
    def _chunk_size(cls, v: Any) -> Any:
        if v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1):
            return v
        raise ValueError("Input should be an integer >= 1 or 'auto'")

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(DEVICE_PATTERN, v):
            raise ValueError("Input should be auto, cpu, cuda, cuda:N (N = 0, 1, ...) or mps")
        return v
