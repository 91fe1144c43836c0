"""Declarative search spaces: ``pipeline/search_spaces/<name>.yaml`` -> a validated :class:`Sweep`.

A space names a base params file, the algorithm run every trial trains, the objective, the
sampler/pruner and, under ``space``, one distribution per dotted params key::

    base: pipeline/search_spaces/base_digits.yaml
    run: fedsparse
    trials: 12
    seeds: [0]
    objective: {kind: single, metric: global/accuracy, reduce: final}
    space:
      algorithms.fedsparse.lambda0: {type: float, low: 1.0e-7, high: 1.0e-3, log: true}
      train.local.lr: {type: float, low: 0.02, high: 0.3, log: true}

Everything is checked before any trial runs, and every error names the key: a key the params do
not have, an empty or reversed range, a log range through zero, and any bound the params
themselves reject (each bound and choice is applied to the base params and validated).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from fedcomm.config import (
    ConfigError,
    Params,
    format_errors,
    read_yaml_mapping,
    validate_params,
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FloatDist(_Strict):
    type: Literal["float"]
    low: float
    high: float
    log: bool = False
    step: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _range(self) -> FloatDist:
        if not self.low < self.high:
            raise ValueError(f"low={self.low} must be < high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log=true needs low > 0 (got low={self.low})")
        if self.log and self.step is not None:
            raise ValueError("step and log=true cannot be combined")
        if self.step is not None and self.step > self.high - self.low:
            raise ValueError(f"step={self.step} exceeds high - low = {self.high - self.low}")
        return self

    def corners(self) -> list[Any]:
        return [self.low, self.high]


class IntDist(_Strict):
    type: Literal["int"]
    low: int
    high: int
    log: bool = False
    step: int = Field(1, ge=1)

    @model_validator(mode="after")
    def _range(self) -> IntDist:
        if not self.low < self.high:
            raise ValueError(f"low={self.low} must be < high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log=true needs low >= 1 (got low={self.low})")
        if self.log and self.step != 1:
            raise ValueError("step and log=true cannot be combined")
        if self.step > self.high - self.low:
            raise ValueError(f"step={self.step} exceeds high - low = {self.high - self.low}")
        return self

    def corners(self) -> list[Any]:
        return [self.low, self.high]


class CategoricalDist(_Strict):
    type: Literal["categorical"]
    choices: list[str | int | float | bool | None] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> CategoricalDist:
        if len({json.dumps(c) for c in self.choices}) != len(self.choices):
            raise ValueError(f"choices has duplicates: {self.choices}")
        return self

    def corners(self) -> list[Any]:
        return list(self.choices)


Distribution = Annotated[FloatDist | IntDist | CategoricalDist, Field(discriminator="type")]
METRICS = ("global/accuracy", "local/accuracy", "topk/accuracy")


SIM_TIME_REDUCES = ("at_time_budget", "time_to_target")  # need the base's `system` section
_ONLY_WITH = {  # field -> the reduce that reads it
    "budget_gib": "at_budget",
    "budget_h": "at_time_budget",
    "target": "time_to_target",
    "penalty_h": "time_to_target",
}


class Objective(_Strict):
    """``objective``: what a trial returns.

    ``single``: ``metric`` reduced by ``reduce`` (``final`` = the mean of the last
    ``evaluate.last_k`` evaluations, ``best`` = its maximum, ``at_budget`` = best within
    ``budget_gib`` of cumulative up + down traffic, ``at_time_budget`` = best within
    ``budget_h`` simulated hours), maximized, mean over the trial's seeds; or
    ``time_to_target``: the simulated hours until ``metric`` first reaches ``target``,
    minimized (a seed that never reaches it counts ``penalty_h`` hours, or, without
    ``penalty_h``, the trial is pruned). The two simulated-time reduces need a base params file
    with a ``system`` section. ``multi``: that accuracy (maximized) and the GiB a run sent
    (``comm: total`` up + down, or ``up``; minimized): a Pareto front, no pruning.
    """

    kind: Literal["single", "multi"] = "single"
    metric: Literal["global/accuracy", "local/accuracy", "topk/accuracy"] = "global/accuracy"
    reduce: Literal["final", "best", "at_budget", "at_time_budget", "time_to_target"] = "final"
    budget_gib: float | None = Field(None, gt=0)
    budget_h: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="simulated hours (reduce: at_time_budget)"
    )
    target: float | None = Field(
        None, gt=0, le=1, description="accuracy to reach (reduce: time_to_target)"
    )
    penalty_h: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        description="hours counted for a seed that never reaches target; null: prune the trial",
    )
    comm: Literal["total", "up"] = "total"

    @model_validator(mode="after")
    def _budget(self) -> Objective:
        if self.reduce == "at_budget" and self.budget_gib is None:
            raise ValueError("reduce: at_budget needs budget_gib (GiB, up + down)")
        if self.reduce == "at_time_budget" and self.budget_h is None:
            raise ValueError("reduce: at_time_budget needs budget_h (simulated hours)")
        if self.reduce == "time_to_target" and self.target is None:
            raise ValueError("reduce: time_to_target needs target (an accuracy in (0, 1])")
        for key, reduce in _ONLY_WITH.items():
            if self.reduce != reduce and getattr(self, key) is not None:
                raise ValueError(
                    f"{key} is only read with reduce: {reduce} (got reduce: {self.reduce})"
                )
        if self.reduce == "time_to_target" and self.kind == "multi":
            raise ValueError(
                "reduce: time_to_target is a single objective (simulated hours, minimized); "
                "kind: multi pairs an accuracy with GiB (use reduce: at_time_budget for that)"
            )
        return self

    @property
    def names(self) -> list[str]:
        acc = f"{self.reduce}:{self.metric}"
        if self.reduce == "at_budget":
            acc = f"at_{self.budget_gib:g}gib:{self.metric}"
        elif self.reduce == "at_time_budget":
            acc = f"at_{self.budget_h:g}h:{self.metric}"
        elif self.reduce == "time_to_target":
            acc = f"sim_hours_to_{self.target:g}:{self.metric}"
        return [acc] if self.kind == "single" else [acc, f"comm/{self.comm}_gib"]

    @property
    def label(self) -> str:
        """The first objective in words: "Final global accuracy", "Best local accuracy",
        "Simulated hours to 80% global accuracy"..."""
        what = self.metric.split("/")[0].replace("topk", "top-k") + " accuracy"
        if self.reduce == "at_budget":
            return f"Best {what} within {self.budget_gib:g} GiB"
        if self.reduce == "at_time_budget":
            return f"Best {what} within {self.budget_h:g} simulated hours"
        if self.reduce == "time_to_target":
            return f"Simulated hours to {100 * (self.target or 0):g}% {what}"
        return f"{self.reduce.capitalize()} {what}"

    @property
    def sim_time(self) -> bool:
        """True when the objective reads the simulated clock (the base needs ``system``)."""
        return self.reduce in SIM_TIME_REDUCES

    @property
    def maximize(self) -> bool:
        """False for ``time_to_target`` (hours, minimized), True for the accuracies."""
        return self.reduce != "time_to_target"

    def shown(self, value: float) -> str:
        """The first objective's value as shown: an accuracy in percent, hours as hours."""
        return f"{100 * value:.2f}%" if self.maximize else f"{value:.4g} h"

    @property
    def unit(self) -> str:
        """The first objective's axis unit: ``%`` or ``h``."""
        return "%" if self.maximize else "h"

    @property
    def directions(self) -> list[Literal["maximize", "minimize"]]:
        if self.kind == "multi":
            return ["maximize", "minimize"]
        return ["maximize"] if self.maximize else ["minimize"]


class Pruner(_Strict):
    """``pruner`` (single objective only): stop a trial whose intermediate objective (reported at
    every evaluated round) falls below the median of earlier trials at the same round, or by
    Hyperband's successive halving over rounds."""

    name: Literal["median", "hyperband", "none"] = "median"
    startup_trials: int = Field(3, ge=0, description="trials that run to the end before pruning")
    warmup_rounds: int = Field(2, ge=0, description="rounds of each trial never pruned")


class Sampler(_Strict):
    name: Literal["tpe", "nsga2", "random"] = "tpe"
    seed: int | None = Field(None, ge=0, description="null: the first of `seeds`")


class Sweep(_Strict):
    """A whole search-space file."""

    study: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]+$", description="default: stem")
    base: str = Field(description="params file the trials start from (relative to the project)")
    run: str = Field(description="key of the base's `algorithms` that each trial trains")
    trials: int = Field(ge=1, description="trials to finish (complete or pruned) in the study")
    seeds: list[Annotated[int, Field(ge=0)]] = Field(default_factory=lambda: [0], min_length=1)
    objective: Objective = Field(default_factory=Objective)
    pruner: Pruner | None = None
    sampler: Sampler = Field(default_factory=Sampler)
    storage: str | None = Field(None, description="null: .optuna/<study>.log; or an RDB URL")
    experiment: str | None = Field(None, description="MLflow experiment; null: sweep/<study>")
    max_failures: int | None = Field(None, ge=1, description="stop after this many failed trials")
    space: dict[str, Distribution] = Field(min_length=1)

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):  # a field check, so it is reported with the others
            raise ValueError(f"seeds has duplicates: {seeds}")
        return seeds

    @model_validator(mode="after")
    def _checks(self) -> Sweep:
        multi = self.objective.kind == "multi"
        if multi and self.pruner is not None and self.pruner.name != "none":
            raise ValueError(
                f"pruner.name={self.pruner.name!r}: multi-objective studies cannot prune "
                "(Optuna's should_prune raises NotImplementedError); use pruner: {name: none}"
            )
        return self

    @property
    def active_pruner(self) -> Pruner:
        if self.pruner is not None:
            return self.pruner
        return Pruner(name="none" if self.objective.kind == "multi" else "median")

    def fingerprint(self, base_raw: dict[str, Any]) -> str:
        """What fixes a study's meaning, the space and the base params (not ``trials``,
        ``storage``, ``max_failures``): a re-run with another fingerprint must not silently
        continue the old study."""
        keep = self.model_dump(
            mode="json", exclude={"trials", "storage", "max_failures", "experiment"}
        )
        blob = json.dumps({"space": keep, "base": base_raw}, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    """``raw["a"]["b"]["c"] = value`` for ``"a.b.c"`` (intermediate dicts created)."""
    node = raw
    *parents, leaf = dotted.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"space.{dotted}: {part!r} is a value, not a section")
        node = child
    node[leaf] = value


def has_dotted(tree: dict[str, Any], dotted: str) -> tuple[bool, list[str]]:
    """Whether ``dotted`` names a leaf of ``tree``; else the keys available where it stops."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, sorted(node) if isinstance(node, dict) else []
        node = node[part]
    return not isinstance(node, dict), []


def leaf(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        node = node[part]
    return node


def apply(base_raw: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A deep copy of ``base_raw`` with ``values`` (dotted keys) set."""
    raw = copy.deepcopy(base_raw)
    for key, value in values.items():
        set_dotted(raw, key, value)
    return raw


def trial_params(sweep: Sweep, base_raw: dict[str, Any], values: dict[str, Any]) -> Params:
    """The params one trial trains: the base with ``values`` set, running only ``sweep.run``
    over ``sweep.seeds``."""
    raw = apply(base_raw, values)
    raw["experiment"] = {"runs": [sweep.run], "seeds": list(sweep.seeds)}
    return validate_params(raw, "trial params")


def load_sweep(path: Path, root: Path | None = None) -> tuple[Sweep, dict[str, Any]]:
    """Read and validate a space file and its base params (relative to ``root``, default the
    space file's project: the current directory). Returns the sweep and the base params' raw
    mapping (what trials modify). Every problem found is reported at once: the file's own
    (ranges, objective, ...) and its keys' (unknown, reserved, another run's)."""
    data = read_yaml_mapping(
        path, "search space", "restore it, or start from one in pipeline/search_spaces/"
    )
    data.setdefault("study", path.stem)
    try:
        sweep: Sweep | None = Sweep.model_validate(data)
        problems: list[str] = []
    except ValidationError as err:
        sweep, problems = None, format_errors(err, str(path), data).splitlines()[1:]
    base_raw: dict[str, Any] = {}
    base_name = sweep.base if sweep is not None else data.get("base")
    run = sweep.run if sweep is not None else data.get("run")
    if isinstance(base_name, str) and isinstance(run, str):
        base_path = (root or Path.cwd()) / base_name
        base_raw = read_yaml_mapping(
            base_path, f"base params of {path}", "fix the space's `base:` key or restore FILE"
        )
        base = validate_params(base_raw, str(base_path))  # the base itself must be valid
        if run not in base.algorithms:
            problems.append(
                f"  - run={run!r} is not a key of {base_name}'s algorithms "
                f"(allowed: {sorted(base.algorithms)})"
            )
        full = base.model_dump(mode="json", by_alias=True)
        if sweep is not None and sweep.objective.sim_time and full["train"].get("system") is None:
            problems.append(
                f"  - objective.reduce={sweep.objective.reduce!r} reads the simulated clock, but "
                f"{base_name} has no `train.system` section (add one, or use final / best / "
                "at_budget)"
            )
        space = data.get("space")
        if isinstance(space, dict):
            problems += [f"  - {p}" for p in _key_problems(list(space), run, full)]
        if sweep is not None and not problems:
            problems += [f"  - {p}" for p in _value_problems(sweep, base_raw, full)]
    if problems:
        raise ConfigError("\n".join([f"{path}: {len(problems)} invalid value(s):", *problems]))
    assert sweep is not None
    return sweep, base_raw


def _key_problems(keys: list[str], run: str, full: dict[str, Any]) -> list[str]:
    """Each swept key must exist in the (defaults-filled) params and reach the tuned run."""
    out = []
    for key in keys:
        if key.startswith("experiment."):
            out.append(f"space.{key}: `experiment` is set by the sweep itself")
        elif key.startswith("algorithms.") and not key.startswith(f"algorithms.{run}."):
            out.append(f"space.{key}: only `algorithms.{run}.*` reaches the tuned run (run: {run})")
        else:
            ok, available = has_dotted(full, key)
            if not ok:
                hint = f" (available there: {', '.join(available)})" if available else ""
                out.append(f"space.{key}: no such params key{hint}")
    return out


def _value_problems(sweep: Sweep, base_raw: dict[str, Any], full: dict[str, Any]) -> list[str]:
    """Each distribution's type fits its key, and every corner value validates as params."""
    out = []
    for key, dist in sweep.space.items():
        current = leaf(full, key)
        if dist.type == "float" and isinstance(current, int) and not isinstance(current, bool):
            out.append(
                f"space.{key}: a float distribution on an integer key (its value is {current}); "
                "use type: int"
            )
            continue
        for value in dist.corners():
            try:
                trial_params(sweep, base_raw, {key: value})
            except ConfigError as err:
                out.append(f"space.{key}: the value {value!r} is rejected by the params: {err}")
                break
    return out
