"""``fedcomm.load_model``: a trained run's final model as a torch module, sparse weights in place.

A run's model file (``model.safetensors``, :mod:`fedcomm.sparse_io`; docs/model_artifact.md)
holds the tensors only. The architecture comes from the config the run was trained with: its
``model`` section, its ``algorithm`` (ProgFed's progressive net, an ensemble's members), its
``seed`` (the initialisation, as the train stage draws it) and what its dataset fixes (one
example's shape, the number of classes or the vocabulary size). :func:`load_model` finds them
beside the model (``run.json`` of a ``runs/<run>-s<seed>/train/`` folder, or the MLflow run's
``config.json`` artifact), which is this module's part; :mod:`fedcomm.evaluation.rebuild`
rebuilds the model exactly as the evaluate stage does and loads the tensors into it, so it
predicts what the run's final evaluation measured.

Example:
    >>> model = fedcomm.load_model("runs/fedsparse-s0")  # doctest: +SKIP
    >>> model(x).argmax(-1)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from pydantic import TypeAdapter, ValidationError
from torch import Tensor, nn

from fedcomm.errors import one_line
from fedcomm.evaluation.rebuild import ModelLoadError, RunSpec, data_shape, rebuild
from fedcomm.paths import RUN_DIR, project_root

MODEL_FILE = "model.safetensors"
RUN_FILE = "run.json"  # beside the model in runs/<run>-s<seed>/train/: {"config": ..., ...}
CONFIG_ARTIFACT = "config.json"  # the resolved run config every MLflow training run logs
_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_PASS_PARAMS = (
    "pass params= (the run's config: run.json's `config` or the MLflow run's config.json, or "
    "the project's params.yaml)"
)

Source = str | Path


@dataclass(frozen=True)
class _Found:
    """Where a model file is and what lies beside it."""

    model: Path
    where: str  # how messages name the source
    config: dict[str, Any] | None = None  # the resolved run config, if found
    run_seed: tuple[str, int] | None = None  # from a runs/<run>-s<seed> folder name
    project: Path | None = None  # the DVC project holding a run folder


def load_model(
    source: Source,
    *,
    params: Any = None,
    map_location: str | torch.device = "cpu",
    data_root: str | Path | None = None,
    input_shape: Sequence[int] | None = None,
    num_classes: int | None = None,
    tracking_uri: str | None = None,
) -> nn.Module:
    """A trained run's final model, its (sparse) weights in place, in eval mode.

    Args:
        source: a run folder of a DVC project (``runs/<run>-s<seed>`` or its ``train/``), a
            ``model.safetensors`` file, or an MLflow run id / ``runs:/<id>`` URI (its
            ``model.safetensors`` and ``config.json`` artifacts are downloaded).
        params: what the run was trained with, when the source does not say (a model file
            without its ``run.json``): the run's resolved config (``run.json``'s ``config`` or
            the MLflow run's ``config.json``, as a mapping or a path), or the project's params
            (a :class:`~fedcomm.config.Params`, its mapping or a ``params.yaml`` path; the run
            and seed then come from the ``<run>-s<seed>`` folder, or the params' only ones).
        map_location: the device the returned module lives on.
        data_root: where the run's dataset is (default: ``data.root`` of the params, else of the
            project's ``params.yaml``, else ``$FEDCOMM_DATA_ROOT``); the dataset is read once
            for the model's input shape and number of classes (vocabulary size).
        input_shape: one example's shape (without the batch dim); with ``num_classes``, the
            dataset is not read.
        num_classes: the number of classes (the vocabulary size for language models).
        tracking_uri: the MLflow store of an MLflow source (default: the project's, as
            :func:`fedcomm.tracking.mlflow.resolve_tracking_uri` resolves it).

    Returns:
        The registry's model with the saved tensors loaded (zeros where the file's bitmap or
        indices hold none). ProgFed: the plain architecture once the final stage is reached,
        else the stage's sub-model (:class:`~fedcomm.models.ProgressiveNet` view); an ensemble
        (``fedavg_mog``): an :class:`~fedcomm.evaluation.rebuild.Ensemble` of its members.

    Raises:
        ModelLoadError: the source, its config, its dataset or its tensors cannot be found or do
            not fit; the message names what and how to pass it.
    """
    with _located(source, tracking_uri) as found:
        tensors = _read_tensors(found)
    spec, project = _run_spec(params, found)
    if input_shape is None or num_classes is None:
        root = data_root if data_root is not None else _config_root(params, project)
        shape, classes = data_shape(spec, root, found.where)
        input_shape = shape if input_shape is None else input_shape
        num_classes = classes if num_classes is None else num_classes
    shape = tuple(int(s) for s in input_shape)
    return rebuild(spec, tensors, shape, num_classes, found.where).eval().to(map_location)


# --- where the model and its config are ------------------------------------------------------


@contextmanager
def _located(source: Source, tracking_uri: str | None) -> Iterator[_Found]:
    text = str(source)
    if text.startswith("runs:/"):
        run_id, _, artifact = text[len("runs:/") :].strip("/").partition("/")
        with _from_mlflow(run_id, artifact or MODEL_FILE, tracking_uri) as found:
            yield found
        return
    path = Path(source).expanduser()
    if path.exists():
        yield _from_path(path)
        return
    if isinstance(source, str) and _RUN_ID.match(source):
        with _from_mlflow(source, MODEL_FILE, tracking_uri) as found:
            yield found
        return
    raise ModelLoadError(
        f"load_model: {text}: no such run folder or model file, nor an MLflow run id "
        "(32 hex digits, or runs:/<id>)"
    )


def _from_path(path: Path) -> _Found:
    if path.is_dir():
        for candidate in (path / "train" / MODEL_FILE, path / MODEL_FILE):
            if candidate.is_file():
                return _from_path(candidate)
        raise ModelLoadError(
            f"{path}: holds no train/{MODEL_FILE} (not a trained run folder: train it with "
            "`fedcomm train --run RUN --seed SEED` or `dvc repro`)"
        )
    config = None
    run_json = path.parent / RUN_FILE
    if run_json.is_file():
        config = _json_config(run_json)
    elif (path.parent / CONFIG_ARTIFACT).is_file():  # MLflow's artifacts, downloaded by hand
        config = _json_config(path.parent / CONFIG_ARTIFACT)
    run_dir = path.parent.parent if path.parent.name == "train" else path.parent
    match = RUN_DIR.match(run_dir.name)
    run_seed = (match["run"], int(match["seed"])) if match else None
    project = run_dir.parent.parent if run_seed else None
    return _Found(path, str(path), config, run_seed, project)


@contextmanager
def _from_mlflow(run_id: str, artifact: str, uri: str | None) -> Iterator[_Found]:
    from fedcomm.tracking import mlflow as tracking

    where = f"MLflow run {run_id}"
    client = tracking.open_client(uri, create=False)
    run = tracking.require_run(
        client, run_id, "check the run id, and the store (tracking_uri= or MLFLOW_TRACKING_URI)"
    )
    names = {a.path for a in client.list_artifacts(run_id)}  # the root: config.json
    folder = artifact.rpartition("/")[0]
    present = {a.path for a in client.list_artifacts(run_id, folder)} if folder else names
    if artifact not in present:
        raise ModelLoadError(
            f"{where}: has no {artifact} artifact (status {run.info.status}; a finished training "
            "run logs one, a sweep trial with several seeds keeps it in each seed's nested run)"
        )
    with tempfile.TemporaryDirectory(prefix="fedcomm-model-") as tmp:
        model = Path(client.download_artifacts(run_id, artifact, tmp))
        config = None
        if CONFIG_ARTIFACT in names:
            config = _json_config(Path(client.download_artifacts(run_id, CONFIG_ARTIFACT, tmp)))
        tags = run.data.tags
        run_seed = None
        if tags.get("run") and str(tags.get("seed", "")).isdigit():
            run_seed = (tags["run"], int(tags["seed"]))
        # the default store is the project's: its params.yaml may name the data root
        project = project_root() if uri is None else None
        yield _Found(model, where, config, run_seed, project)


def _json_config(path: Path) -> dict[str, Any]:
    """The resolved run config in ``run.json`` (its ``config``) or ``config.json`` (itself)."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelLoadError(
            f"{path}: not readable JSON ({one_line(err)}); {_PASS_PARAMS}"
        ) from None
    if isinstance(doc, dict) and isinstance(doc.get("config"), dict):
        doc = doc["config"]
    if not (isinstance(doc, dict) and {"model", "data", "algorithm"} <= doc.keys()):
        raise ModelLoadError(
            f"{path}: not a run's config (no model, data and algorithm keys); {_PASS_PARAMS}"
        )
    return dict(doc)


def _read_tensors(found: _Found) -> dict[str, Tensor]:
    from fedcomm.sparse_io import load_sparse

    try:
        return dict(load_sparse(found.model))
    except Exception as err:  # safetensors, json and layout errors of a damaged file
        raise ModelLoadError(
            f"{found.where}: not a readable fedcomm model file ({one_line(err)})"
        ) from None


# --- the config the run was trained with -----------------------------------------------------


def _run_spec(params: Any, found: _Found) -> tuple[RunSpec, Path | None]:
    """The run's spec and the project folder whose ``params.yaml`` may name the data root."""
    if params is None:
        if found.config is None:
            raise ModelLoadError(
                f"{found.where}: no {RUN_FILE} beside the model, so the architecture is "
                f"unknown; {_PASS_PARAMS}"
            )
        return _parse(found.config, found.where), found.project
    if isinstance(params, str | Path):
        path = Path(params).expanduser()
        if path.suffix == ".json":
            return _parse(_json_config(path), str(path)), found.project
        from fedcomm.config import read_yaml_mapping

        raw = read_yaml_mapping(path, "params", f"{_PASS_PARAMS} that exists")
        return _project_spec(raw, found, str(path)), path.parent
    if isinstance(params, Mapping) and {"model", "data", "algorithm"} <= params.keys():
        return _parse(params, "params"), found.project
    return _project_spec(params, found, "params"), found.project


def _project_spec(params: Any, found: _Found, what: str) -> RunSpec:
    """The spec of the source's run in a project's params."""
    from fedcomm.config import ConfigError, Params, validate_params

    try:
        p = params if isinstance(params, Params) else validate_params(params, what)
    except ConfigError as err:
        raise ModelLoadError(f"load_model: {one_line(err)}") from None
    if found.config is not None:
        run, seed = str(found.config["run"]), int(found.config["seed"])
    elif found.run_seed is not None:
        run, seed = found.run_seed
    elif len(p.experiment.runs) == 1 and len(p.experiment.seeds) == 1:
        run, seed = p.experiment.runs[0], p.experiment.seeds[0]
    else:
        raise ModelLoadError(
            f"{found.where}: which run and seed of {what} it is is unknown (no runs/<run>-s<seed> "
            "folder); pass params= as the run's own config (run.json's `config`)"
        )
    try:
        return _spec(p.model, p.algorithm(run), p.data, seed)
    except ConfigError as err:
        raise ModelLoadError(f"{found.where}: {one_line(err)} (in {what})") from None


def _spec(model: Any, algorithm: Any, data: Any, seed: int) -> RunSpec:
    """What rebuilding the model needs of a run's validated ``model``, ``algorithm`` and ``data``
    configs and its seed."""
    from fedcomm.config import model_options

    return RunSpec(
        model=model.name,
        model_options=model_options(model),
        algorithm=algorithm,
        dataset=data.dataset.name,
        dataset_options=data.options(),
        seed=seed,
    )


def _config_root(params: Any, project: Path | None) -> str | Path | None:
    """``data.root`` of the given params, else of the project's ``params.yaml`` (relative to
    the project, where the stages run); None defers to ``$FEDCOMM_DATA_ROOT``."""
    root = getattr(getattr(params, "data", None), "root", None)
    if root is None and isinstance(params, Mapping):
        root = (params.get("data") or {}).get("root")
    if root is None and project is not None and (project / "params.yaml").is_file():
        import yaml

        try:
            doc = yaml.safe_load((project / "params.yaml").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            doc = None
        data = doc.get("data") if isinstance(doc, dict) else None
        root = data.get("root") if isinstance(data, dict) else None
    if not isinstance(root, str) or not root:
        return None
    path = Path(root).expanduser()
    return path if path.is_absolute() or project is None else project / path


def _parse(cfg: Mapping[str, Any], where: str) -> RunSpec:
    """The spec in a resolved run config (``run.json``'s ``config``, MLflow's ``config.json``)."""
    from fedcomm.config import AlgorithmUnion, DataConfig, ModelConfig

    missing = [k for k in ("model", "data", "algorithm", "seed") if k not in cfg]
    if missing:
        raise ModelLoadError(f"{where}: the run's config lacks {missing}; {_PASS_PARAMS}")
    try:
        return _spec(
            TypeAdapter(ModelConfig).validate_python(cfg["model"]),
            TypeAdapter(AlgorithmUnion).validate_python(cfg["algorithm"]),
            DataConfig.model_validate(cfg["data"]),
            int(cfg["seed"]),
        )
    except (ValidationError, TypeError, ValueError) as err:
        raise ModelLoadError(
            f"{where}: the run's config does not validate (written by another version?): "
            f"{one_line(err)}"
        ) from None
