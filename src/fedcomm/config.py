"""Typed configuration: one pydantic section per stage of ``params.yaml``.

Every model is frozen and forbids unknown keys. Algorithm configs form a discriminated union on
``name`` built from the algorithm registry; datasets, partitioners and models likewise
discriminate on ``name``/``kind``. :func:`load_params` validates a whole file *before any work*
and raises :class:`ConfigError` whose message names the key path, the bad value and what is
allowed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedcomm.algorithms import CONFIGS, AlgorithmConfig
from fedcomm.algorithms._local import LocalConfig
from fedcomm.comm.compressors.config import (  # noqa: F401  (part of the params schema)
    CompressorConfig,
    DgcCompressor,
    FedPaqCompressor,
    LqCompressor,
    NoCompressor,
    SignSgdCompressor,
    SpCompressor,
    StcCompressor,
)
from fedcomm.errors import InputError, one_line
from fedcomm.evaluation.caps import CapAxis
from fedcomm.simulation.device import DEVICE_PATTERN
from fedcomm.system.config import SystemConfig


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


# --- data ------------------------------------------------------------------------------------


VERIFY: Any = Field(  # the `verify` key of the datasets with a standard release
    True,
    description="check the files against the standard release's MD5 digests (false: your "
    "own copy); checks only, the data read is the same",
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


class Cifar100(Strict):
    name: Literal["cifar100"] = "cifar100"
    label: Literal["fine", "coarse"] = "fine"
    verify: bool = VERIFY


class ImageFolder(Strict):
    """Any dataset in torchvision's ImageFolder layout: ``<path>/{train,test}/<class>/<image>``
    under the data root, decoded once and cached by content (``fedcomm.data.image_folder``)."""

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


# --- partition -------------------------------------------------------------------------------


class _Partition(Strict):
    test_fraction: float = Field(0.2, ge=0, lt=1, description="per-client test share")
    seed: int = Field(0, ge=0)


class IidPartition(_Partition):
    kind: Literal["iid"] = "iid"
    num_partitions: int = Field(ge=1)
    shuffle: bool = True


class DirichletPartition(_Partition):
    kind: Literal["dirichlet"] = "dirichlet"
    num_partitions: int = Field(ge=1)
    alpha: float | list[float] = 0.5
    min_partition_size: int = Field(10, ge=0)
    self_balancing: bool = False
    shuffle: bool = True
    max_retries: int = Field(10, ge=1)

    @model_validator(mode="after")
    def _alpha_positive(self) -> DirichletPartition:
        alphas = self.alpha if isinstance(self.alpha, list) else [self.alpha]
        if any(a <= 0 for a in alphas):
            raise ValueError(f"alpha must be > 0 (got {self.alpha})")
        if isinstance(self.alpha, list) and len(self.alpha) != self.num_partitions:
            raise ValueError(
                f"alpha as a list needs num_partitions={self.num_partitions} entries, "
                f"got {len(self.alpha)}"
            )
        return self


class PathologicalPartition(_Partition):
    kind: Literal["pathological"] = "pathological"
    num_partitions: int = Field(ge=1)
    num_classes_per_partition: int = Field(ge=1)
    class_assignment_mode: Literal["random", "deterministic", "first-deterministic"] = (
        "first-deterministic"
    )
    shuffle: bool = True


class ShardPartition(_Partition):
    kind: Literal["shard"] = "shard"
    num_partitions: int = Field(ge=1)
    num_shards_per_partition: int | None = Field(None, ge=1)
    shard_size: int | None = Field(None, ge=1)
    keep_incomplete_shard: bool = False
    shuffle: bool = True


class SizePartition(_Partition):
    kind: Literal["size"] = "size"
    num_partitions: int = Field(ge=1)
    partition_sizes: list[int] | None = None
    sigma: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _one_of(self) -> SizePartition:
        if (self.partition_sizes is None) == (self.sigma is None):
            raise ValueError("set exactly one of partition_sizes and sigma")
        return self


class LabelCyclePartition(_Partition):
    """pFedBayes / FedBIAD Table I scheme: client k holds labels (k·s + j) mod C, j < n_l, with
    s = ``client_stride`` (default n_l, as pFedBayes' code; 1 is pFedMe's sliding window)."""

    kind: Literal["label_cycle"] = "label_cycle"
    num_partitions: int = Field(ge=1)
    labels_per_partition: int = Field(5, ge=1)
    client_stride: int | None = Field(
        None, ge=1, description="s in (k·s + j) mod C; None: s = n_l (pFedBayes' code)"
    )
    shuffle: bool = True


class LotteryflPartition(_Partition):
    """FedDST's AAAI-era LotteryFL split: 2 label-sorted shards of 20 train rows per client,
    and ``test_per_class`` test rows of each class it holds (shared between holders)."""

    kind: Literal["lotteryfl"] = "lotteryfl"
    num_partitions: int = Field(ge=1)
    test_fraction: float = Field(0.0, description="must be 0: test rows are drawn per class")
    shards_per_client: int = Field(2, ge=1)
    shard_size: int = Field(20, ge=1)
    test_per_class: int = Field(100, ge=1)
    shuffle: bool = True

    @model_validator(mode="after")
    def _no_test_fraction(self) -> LotteryflPartition:
        if self.test_fraction != 0:
            raise ValueError(
                f"test_fraction must be 0 for lotteryfl (got {self.test_fraction}): each client "
                "tests on test_per_class rows of each class it holds"
            )
        return self


class NaturalIdPartition(_Partition):
    kind: Literal["natural_id"] = "natural_id"
    num_partitions: int | None = Field(None, ge=1, description="keep the first K natural ids")


PartitionConfig = Annotated[
    IidPartition
    | DirichletPartition
    | PathologicalPartition
    | ShardPartition
    | SizePartition
    | LabelCyclePartition
    | LotteryflPartition
    | NaturalIdPartition,
    Field(discriminator="kind"),
]


# --- model -----------------------------------------------------------------------------------


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


# --- train -----------------------------------------------------------------------------------


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
    device: str = Field(
        "auto",
        description="where the model, the clients' data, training and evaluation live: auto "
        "(cuda if available, else cpu), cpu, cuda, cuda:N or mps; a device this machine lacks "
        "is an error before any work",
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


class ExperimentConfig(Strict):
    """``experiment``: which algorithm runs and seeds the pipeline expands over (DVC matrix)."""

    runs: list[str] = Field(min_length=1, description="keys of `algorithms` to train")
    seeds: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1)


def _algorithm_union() -> Any:
    members = tuple(CONFIGS[name] for name in sorted(CONFIGS))
    return Annotated[Union[members], Field(discriminator="name")]  # noqa: UP007


AlgorithmUnion: Any = _algorithm_union()


# --- evaluate / summarize / tracking ------------------------------------------------------------


class LinkConfig(Strict):
    down_mbps: float = Field(110.6, gt=0)
    up_mbps: float = Field(14.0, gt=0)


class EvaluateConfig(Strict):
    """``evaluate``: summaries over a finished run."""

    budgets_gib: list[Annotated[float, Field(gt=0)]] = Field(default_factory=list)
    upload_caps_gib: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=list,
        description="FedDST upload caps: best global accuracy within each cumulative traffic "
        "cap on upload_cap_axis (GiB)",
    )
    upload_cap_axis: CapAxis = Field(
        "up_down",
        description="what upload_caps_gib count: up_down = cumulative upload + download of all "
        "clients (the reading that reproduces FedDST's Table 1 FedAvgM row, "
        "docs/reproductions/audit/feddst.md); up = cumulative upload only",
    )
    targets: list[Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=list)
    time_budgets_h: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default_factory=list,
        description="simulated-time budgets (hours, runs with a system section): best accuracy "
        "over the evaluations whose time/sim_elapsed_s is within each, the rule of budgets_gib",
    )
    link: LinkConfig = Field(default_factory=LinkConfig)
    metric: Literal["global/accuracy", "topk/accuracy"] = Field(
        "global/accuracy",
        description="the accuracy budgets, caps and targets refer to (topk: train.topk, e.g. "
        "FedBIAD's top-3 next-word accuracy)",
    )


# the rounds columns the summarize stage's curves (reports/curves.csv) keep, and their names there
CURVE_COLUMNS = {
    "round": "round",
    "comm/cum_gib": "cum_gib",
    "comm/cum_up_bytes": "cum_up_bytes",
    "global/accuracy": "global_accuracy",
    "local/accuracy": "local_accuracy",
    "topk/accuracy": "topk_accuracy",
    "global/loss": "global_loss",
    "model/sparsity": "model_sparsity",
    "time/sim_elapsed_s": "sim_elapsed_s",  # simulated seconds (runs with a system section only)
}
POINTS_METRICS = ("global_accuracy", "local_accuracy", "topk_accuracy", "model_sparsity")


class PairedConfig(Strict):
    """One ``summarize.paired`` comparison: ``d = a − b`` per seed of a curve's final value (the
    mean of its last ``summarize.last_k`` evaluations), decided by the one-sided paired t rule
    (``a − b > margin`` for ``greater``, ``< margin`` for ``less``; 95%, t at n − 1 df)."""

    a: str
    b: str
    metric: str = "global_accuracy"
    direction: Literal["greater", "less"] = "greater"
    margin: float = Field(0.0, description="in shown units (points for accuracies, sparsity)")
    scale: float | None = Field(
        None, gt=0, description="d is shown x scale; null: 100 (points) for accuracies, else 1"
    )

    @field_validator("metric")
    @classmethod
    def _known_curve(cls, metric: str) -> str:
        allowed = [c for c in CURVE_COLUMNS.values() if c != "round"]
        if metric not in allowed:
            raise ValueError(f"{metric!r} is not a curve column (allowed: {allowed})")
        return metric

    @model_validator(mode="after")
    def _two_runs(self) -> PairedConfig:
        if self.a == self.b:
            raise ValueError(f"a and b are the same run ({self.a!r})")
        return self

    @property
    def shown_scale(self) -> float:
        if self.scale is not None:
            return self.scale
        return 100.0 if self.metric in POINTS_METRICS else 1.0


class SummarizeConfig(Strict):
    title: str = "fedcomm experiment"
    last_k: int = Field(
        5, ge=1, description="final accuracy = the mean of each seed's last k evaluations"
    )
    paired: list[PairedConfig] = Field(
        default_factory=list, description="paired comparisons over seeds (the decision rule)"
    )


class TrackingConfig(Strict):
    """``tracking``: MLflow. ``uri`` null = ``sqlite:///<project root>/mlflow.db`` (absolute)."""

    uri: str | None = None
    experiment: str = "fedcomm"
    enabled: bool = True


class Params(Strict):
    """The whole ``params.yaml``."""

    experiment: ExperimentConfig
    data: DataConfig = Field(default_factory=DataConfig)
    partition: PartitionConfig
    model: ModelConfig
    train: TrainConfig
    algorithms: dict[str, AlgorithmUnion]
    evaluate: EvaluateConfig = Field(default_factory=EvaluateConfig)
    summarize: SummarizeConfig = Field(default_factory=SummarizeConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)

    @model_validator(mode="after")
    def _runs_exist(self) -> Params:
        runs = self.experiment.runs
        for i, run in enumerate(runs):
            if run not in self.algorithms:
                raise ValueError(
                    f"experiment.runs[{i}]={run!r} is not a key of algorithms "
                    f"(allowed: {sorted(self.algorithms)})"
                )
        if len(set(runs)) != len(runs):
            raise ValueError(f"experiment.runs has duplicates: {runs}")
        if len(set(self.experiment.seeds)) != len(self.experiment.seeds):
            raise ValueError(f"experiment.seeds has duplicates: {self.experiment.seeds}")
        for i, pair in enumerate(self.summarize.paired):
            for arm in ("a", "b"):
                if getattr(pair, arm) not in runs:
                    raise ValueError(
                        f"summarize.paired[{i}].{arm}={getattr(pair, arm)!r} is not a run of "
                        f"experiment.runs (allowed: {runs})"
                    )
        k = self.partition.num_partitions
        if k is not None and self.train.clients_per_round > k:
            raise ValueError(
                f"train.clients_per_round={self.train.clients_per_round} exceeds "
                f"partition.num_partitions={k} (allowed: 1..{k})"
            )
        return self

    def algorithm(self, run: str) -> AlgorithmConfig:
        if run not in self.algorithms:
            raise ConfigError(
                f"algorithms.{run}: no such entry (allowed: {sorted(self.algorithms)})"
            )
        cfg: AlgorithmConfig = self.algorithms[run]
        try:
            return cfg.with_rounds(self.train.rounds)  # round-dependent defaults resolved
        except ValueError as err:
            raise ConfigError(f"algorithms.{run}: {err}") from None


class ConfigError(InputError, ValueError):
    """A params file that does not validate; the message lists every problem by key path."""


def keyed(message: str, section: Sequence[str], keys: Iterable[str]) -> str | None:
    """A check's ``"<key> must ..."`` message as ``"<section>.<key>: must ..."`` when ``<key>``
    is one of ``keys`` (``"alpha must be > 0"`` -> ``"partition.alpha: must be > 0"``); None
    for a message that does not start with a key."""
    field, _, rest = message.partition(" ")
    if field in set(keys) and rest.startswith("must "):
        return f"{'.'.join([*section, field])}: {rest}"
    return None


def format_errors(err: ValidationError, source: str, raw: Any = None) -> str:
    """One line per problem: ``key.path: what is wrong (got value; allowed ...)``."""
    lines = [f"{source}: {err.error_count()} invalid value(s):"]
    for e in err.errors():
        parts = _clean_location(e["loc"], raw)
        value = e.get("input")
        allowed = ""
        if e["type"] == "union_tag_invalid":
            key = str(e.get("ctx", {}).get("discriminator", "")).strip("'")
            parts.append(key)
            value = value.get(key) if isinstance(value, dict) else value
        elif e["type"] == "extra_forbidden":
            model = _model_at(parts[:-1], raw)
            if model is not None:
                allowed = f"; allowed keys: {', '.join(sorted(model.model_fields))}"
        if e["type"] == "missing":
            shown = "<missing>"
        elif isinstance(value, dict):
            tag = {k: value[k] for k in ("name", "kind") if k in value}
            shown = (
                f"a mapping with {tag}" if tag else f"a mapping with keys {sorted(map(str, value))}"
            )
        else:
            shown = repr(value)
        loc = ".".join(parts) or "<top level>"
        if e["type"] == "value_error" and isinstance(value, dict):  # a cross-field check
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"  - {keyed(msg, parts, value) or f'{loc}: {msg}'}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(f"  - {loc}: {msg} (got {shown}{allowed})")
    return "\n".join(lines)


def _clean_location(loc: tuple[int | str, ...], raw: Any) -> list[str]:
    """Drop the discriminator tags pydantic inserts into union members' locations."""
    parts: list[str] = []
    node = raw
    for part in loc:
        tags = (node.get("name"), node.get("kind")) if isinstance(node, dict) else ()
        if isinstance(node, dict) and part not in node and part in tags:
            continue  # a union tag, not a key of the input
        parts.append(str(part))
        node = _child(node, part)
    return parts


def _child(node: Any, part: int | str) -> Any:
    if isinstance(node, dict):
        return node.get(part)
    if isinstance(node, list) and str(part).isdigit() and int(part) < len(node):
        return node[int(part)]
    return None


def _model_at(path: list[str], raw: Any) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``path`` of the raw params."""
    tp: Any = Params
    node = raw
    for part in path:
        tp = _concrete(tp, node)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if part not in tp.model_fields:
                return None
            tp = tp.model_fields[part].annotation
        elif get_origin(tp) in (dict, list):
            tp = get_args(tp)[-1]
        else:
            return None
        node = _child(node, part)
    tp = _concrete(tp, node)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _concrete(tp: Any, node: Any) -> Any:
    """Strip ``Annotated``/``Optional``; pick a union member by the input's name/kind tag."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    if get_origin(tp) in (Union, UnionType):
        members = [m for m in get_args(tp) if m is not type(None)]
        tag = node.get("name", node.get("kind")) if isinstance(node, dict) else None
        for m in members:
            m = _concrete(m, node)
            if isinstance(m, type) and issubclass(m, BaseModel):
                key = "name" if "name" in m.model_fields else "kind"
                if key in m.model_fields and tag in get_args(m.model_fields[key].annotation):
                    return m
        return members[0] if len(members) == 1 else None
    return tp


def validate_params(raw: Mapping[str, Any], source: str = "params") -> Params:
    """Validate a parsed params mapping; raises :class:`ConfigError` naming every bad key."""
    try:
        return Params.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(format_errors(err, source, raw)) from None


def read_yaml_mapping(
    path: str | Path,
    what: str = "params file",
    remedy: str = "pass --params PATH, or restore it (`git checkout -- FILE`)",
) -> dict[str, Any]:
    """A YAML file whose top level is a mapping; :class:`ConfigError` naming ``what``, the path
    and ``remedy`` (``FILE`` is replaced by the path) if it is missing, empty, unreadable, not
    YAML or not a mapping. Bad keys or values are the schema's business, not this function's."""
    p = Path(path)
    fix = remedy.replace("FILE", str(p))
    if not p.is_file():
        raise ConfigError(f"{p}: {what} not found (no such file); {fix}")
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{p}: {what} is not valid YAML ({one_line(err)}); {fix}") from None
    if raw is None:
        raise ConfigError(f"{p}: {what} is empty; {fix}")
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{p}: {what} must be a mapping at the top level, got {type(raw).__name__}; {fix}"
        )
    return raw


def load_params(path: str | Path) -> Params:
    """Read and validate a params YAML file (no side effects)."""
    return validate_params(read_yaml_mapping(path), str(path))
