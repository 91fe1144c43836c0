"""The whole ``params.yaml``: its root model, the sections that span the others (``experiment``,
``algorithms``, ``tracking``) and the checks across sections; reading and validating a file.

:func:`load_params` validates a whole file *before any work* and raises :class:`ConfigError`
whose message names the key path, the bad value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, Field, ValidationError, model_validator

from fedcomm.algorithms import CONFIGS, AlgorithmConfig
from fedcomm.config.base import Strict
from fedcomm.config.data import DataConfig
from fedcomm.config.evaluate import EvaluateConfig
from fedcomm.config.model import ModelConfig
from fedcomm.config.partition import PartitionConfig
from fedcomm.config.summarize import SummarizeConfig
from fedcomm.config.train import TrainConfig
from fedcomm.errors import InputError, one_line


class ExperimentConfig(Strict):
    """``experiment``: which algorithm runs and seeds the pipeline expands over (DVC matrix)."""

    runs: list[str] = Field(min_length=1, description="keys of `algorithms` to train")
    seeds: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1)


def _algorithm_union() -> Any:
    members = tuple(CONFIGS[name] for name in sorted(CONFIGS))
    return Annotated[Union[members], Field(discriminator="name")]  # noqa: UP007


AlgorithmUnion: Any = _algorithm_union()


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
