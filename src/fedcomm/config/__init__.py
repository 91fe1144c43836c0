"""Typed configuration: one pydantic module per section of ``params.yaml``.

==============================  ==========================================================
params section                  module
==============================  ==========================================================
``experiment``                  :mod:`fedcomm.config.params`
``data``                        :mod:`fedcomm.config.data`
``partition``                   :mod:`fedcomm.config.partition`
``model``                       :mod:`fedcomm.config.model`
``train``                       :mod:`fedcomm.config.train`; its sub-sections beside their code:
                                ``train.local`` :mod:`fedcomm.algorithms.core.local`,
                                ``train.compressor`` :mod:`fedcomm.comm.compressors.config`,
                                ``train.system`` :mod:`fedcomm.system.config`
``algorithms``                  :mod:`fedcomm.config.params` (the union on ``name``); each
                                algorithm's config beside its rule in :mod:`fedcomm.algorithms`
``evaluate``                    :mod:`fedcomm.config.evaluate`
``summarize``                   :mod:`fedcomm.config.summarize`
``tracking``                    :mod:`fedcomm.config.params`
the whole file                  :mod:`fedcomm.config.params` (``Params``, ``load_params``,
                                ``validate_params``, ``ConfigError``)
==============================  ==========================================================

Every model is frozen and forbids unknown keys (:class:`~fedcomm.config.base.Strict`).
Algorithm configs form a discriminated union on ``name`` built from the algorithm registry;
datasets, partitioners and models likewise discriminate on ``name``/``kind``.
:func:`load_params` validates a whole file *before any work* and raises :class:`ConfigError`
whose message names the key path, the bad value and what is allowed. Import from here
(``from fedcomm.config import Params``); a test of one section may import its module.
"""

from fedcomm.comm.compressors.config import (
    CompressorConfig,
    DgcCompressor,
    FedPaqCompressor,
    LqCompressor,
    NoCompressor,
    SignSgdCompressor,
    SpCompressor,
    StcCompressor,
)
from fedcomm.config.base import Strict
from fedcomm.config.data import (
    NORMALIZE,
    VERIFY,
    Cifar10,
    Cifar100,
    DataConfig,
    DatasetConfig,
    Digits,
    Femnist,
    ImageFolder,
    Mnist,
    Ptb,
    Shakespeare,
    Standardize,
    Synthetic,
)
from fedcomm.config.evaluate import EvaluateConfig, LinkConfig
from fedcomm.config.model import (
    CnnModel,
    FeddstCnnModel,
    LstmModel,
    MlpModel,
    ModelConfig,
    ProgfedCifarCnnModel,
    ProgfedEmnistCnnModel,
    ResNet18Model,
    ResNetModel,
    model_options,
)
from fedcomm.config.params import (
    AlgorithmUnion,
    ConfigError,
    ExperimentConfig,
    Params,
    TrackingConfig,
    format_errors,
    keyed,
    load_params,
    read_yaml_mapping,
    validate_params,
)
from fedcomm.config.partition import (
    DirichletPartition,
    IidPartition,
    LabelCyclePartition,
    LotteryflPartition,
    NaturalIdPartition,
    PartitionConfig,
    PathologicalPartition,
    ShardPartition,
    SizePartition,
)
from fedcomm.config.summarize import (
    CURVE_COLUMNS,
    POINTS_METRICS,
    PairedConfig,
    SummarizeConfig,
)
from fedcomm.config.train import TrainConfig

__all__ = [
    "CURVE_COLUMNS",
    "NORMALIZE",
    "POINTS_METRICS",
    "VERIFY",
    "AlgorithmUnion",
    "Cifar10",
    "Cifar100",
    "CnnModel",
    "CompressorConfig",
    "ConfigError",
    "DataConfig",
    "DatasetConfig",
    "DgcCompressor",
    "Digits",
    "DirichletPartition",
    "EvaluateConfig",
    "ExperimentConfig",
    "FedPaqCompressor",
    "FeddstCnnModel",
    "Femnist",
    "IidPartition",
    "ImageFolder",
    "LabelCyclePartition",
    "LinkConfig",
    "LotteryflPartition",
    "LqCompressor",
    "LstmModel",
    "MlpModel",
    "Mnist",
    "ModelConfig",
    "NaturalIdPartition",
    "NoCompressor",
    "PairedConfig",
    "Params",
    "PartitionConfig",
    "PathologicalPartition",
    "ProgfedCifarCnnModel",
    "ProgfedEmnistCnnModel",
    "Ptb",
    "ResNet18Model",
    "ResNetModel",
    "Shakespeare",
    "ShardPartition",
    "SignSgdCompressor",
    "SizePartition",
    "SpCompressor",
    "Standardize",
    "StcCompressor",
    "Strict",
    "SummarizeConfig",
    "Synthetic",
    "TrackingConfig",
    "TrainConfig",
    "format_errors",
    "keyed",
    "load_params",
    "model_options",
    "read_yaml_mapping",
    "validate_params",
]
