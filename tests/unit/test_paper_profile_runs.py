"""Every paper-scale profile runs end to end (issue 27, part 5): partition -> train (every run of
``experiment.runs``) -> evaluate -> summarize, through the library's stage functions, on tiny data
of the profile's shapes and class counts.

Each test reads the REAL profile file and applies a cut computed from it; everything else (the
model at full size, every algorithm run and its settings, the partition kind and its keys, the
local training, evaluation, tracking) is the profile's own, and the test checks that the cut
touched nothing but the keys below:

- ``experiment.seeds``: the first seed only;
- ``train.rounds``: 2, or ``2 x stages`` when a ProgFed run has more stages (ProgFed refuses
  ``rounds < 2S``: each early stage needs ``T / (2S) >= 1`` round);
- ``algorithms.<run>.warmup_rounds``: at most 1 (ProgFed's ``W`` extra rounds per growth: the
  warm-up path runs, 3 extra rounds instead of 75);
- ``algorithms.<run>.initial_rounds``: at most 2 (PruneFL's phase one: its single-client local
  rounds before round 1, 1000 in feddst_cifar10; 2 reach its first readjustment);
- ``train.clients_per_round``: 2;
- ``partition.num_partitions``: as few clients as the tiny data allows (below, per profile);
- ``partition.test_per_class`` (LotteryFL): what the tiny pool has left outside the train shards;
- ``data.root`` and ``data.dataset.path``: the tiny data written by the test.

The tiny data goes through the real loader each profile names: a JPEG ImageFolder tree of the
10 CIFAR-10 classes (``image_folder``, :mod:`tests.image_folders`), CIFAR-100 python pickles of
random pixels with 100 fine / 20 coarse labels (``cifar100``; CIFAR-100 is not available), and
PTB-format text with a 10,000-word vocabulary (``ptb``). The real-data runs at full scale are in
docs/paper_scale.md (``make reproduce NAME=x PROFILE=<cut copy>``).
"""

from __future__ import annotations

import json
import math
import pickle
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from fedcomm.config import Params, read_yaml_mapping, validate_params
from fedcomm.stages.evaluate import evaluate_stage
from fedcomm.stages.partition import partition_stage
from fedcomm.stages.paths import Paths
from fedcomm.stages.summarize import summarize_stage
from fedcomm.stages.train import loop_config, train_stage
from tests.conftest import REPO
from tests.image_folders import write_image_folder

PROFILES = REPO / "pipeline" / "reproductions"
CIFAR10_CLASSES = (
    "airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck",
)  # fmt: skip
PTB_VOCAB = 10_000  # Mikolov's PTB: 10,000 words, <unk> and <eos> included

#: the only keys a cut may change (dotted; ``*`` = any algorithm run)
CUT_KEYS = {
    "experiment.seeds",
    "train.rounds",
    "train.clients_per_round",
    "partition.num_partitions",
    "partition.test_per_class",
    "data.root",
    "data.dataset.path",
    "algorithms.*.warmup_rounds",
    "algorithms.*.initial_rounds",
}


# --- tiny data of each profile's shapes --------------------------------------------------------


def cifar10_folder(root: Path, path: str) -> Path:
    """The 10 CIFAR-10 classes as JPEG (q75, as the offline copy), 40 train + 10 test each."""
    return write_image_folder(root / path, classes=CIFAR10_CLASSES, per_class=(40, 10))


def cifar100_pickles(root: Path, rows_per_class: int = 3) -> Path:
    """``cifar-100-python/{train,test}`` of random uint8 pixels: every fine label
    ``rows_per_class`` times (5/6 in train), coarse label = fine // 5. Too few rows for the
    standard batch's MD5 check, which only applies to 50,000 / 10,000-row files."""
    rng = np.random.default_rng(0)
    fine = np.repeat(np.arange(100), rows_per_class)  # (n,)
    data = rng.integers(0, 256, (len(fine), 3 * 32 * 32), dtype=np.uint8)  # (n, 3072) CHW rows
    is_test = np.arange(len(fine)) % 6 == 5
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    for name, rows in (("train", ~is_test), ("test", is_test)):
        batch = {
            b"data": data[rows],
            b"fine_labels": fine[rows].tolist(),
            b"coarse_labels": (fine[rows] // 5).tolist(),
        }
        (folder / name).write_bytes(pickle.dumps(batch))
    return folder


def ptb_text(root: Path) -> Path:
    """``ptb/ptb.{train,valid,test}.txt`` in Mikolov's format (lower-case words, ``<unk>``, one
    sentence a line, ``<eos>`` added by the loader) with exactly ``PTB_VOCAB`` words: each of
    9,998 words once, shuffled, in lines of 20, 10% in valid and test."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in rng.permutation(PTB_VOCAB - 2)] + ["<unk>"]
    lines = [" " + " ".join(words[i : i + 20]) + " \n" for i in range(0, len(words), 20)]
    folder = root / "ptb"
    folder.mkdir(parents=True)
    n = len(lines)
    splits = {"train": lines[: n * 8 // 10], "valid": lines[n * 8 // 10 : n * 9 // 10]}
    splits["test"] = lines[n * 9 // 10 :]
    for split, part in splits.items():
        (folder / f"ptb.{split}.txt").write_text("".join(part), encoding="utf-8")
    return folder


# --- the cut -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tiny:
    """How one profile is cut: its tiny data and the partition keys that must shrink with it."""

    write: Callable[[Path, Mapping[str, Any]], Path]  # (data root, profile's data.dataset)
    partition: Callable[[Mapping[str, Any]], dict[str, Any]]  # profile's partition -> changes


TINY: dict[str, Tiny] = {
    # 500 images; Dirichlet over 4 clients of >= min_partition_size (50) rows
    "fedsparse_cifar10": Tiny(
        lambda root, ds: cifar10_folder(root, ds["path"]),
        lambda part: {"num_partitions": 4},
    ),
    # LotteryFL: 4 clients x 2 shards x 20 rows = 160 train rows; 5 test rows per held class
    "feddst_cifar10": Tiny(
        lambda root, ds: cifar10_folder(root, ds["path"]),
        lambda part: {"num_partitions": 4, "test_per_class": 5},
    ),
    # pathological: as few clients as cover the 100 classes (100 / 20 = 5), 3 rows a class
    # (a class goes to up to 3 of them): about 36 rows a client
    "progfed_cifar100": Tiny(
        lambda root, ds: cifar100_pickles(root),
        lambda part: {"num_partitions": math.ceil(100 / part["num_classes_per_partition"])},
    ),
    # IID: ~300 windows of 35 tokens (10,000 distinct words) over 30 clients: ~10 windows each
    "fedbiad_ptb": Tiny(lambda root, ds: ptb_text(root), lambda part: {"num_partitions": 30}),
}


def cut_profile(name: str, root: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the profile as read, its cut): tiny data written under ``root``, the cut keys set."""
    raw = read_yaml_mapping(PROFILES / f"{name}.yaml", "profile")
    cut = json.loads(json.dumps(raw))  # a deep copy
    tiny = TINY[name]
    tiny.write(root, raw["data"]["dataset"])
    profile = validate_params(raw, name)
    runs = profile.experiment.runs
    stages = [getattr(profile.algorithm(r), "stages", 1) for r in runs]
    cut["experiment"]["seeds"] = raw["experiment"]["seeds"][:1]
    cut["train"]["rounds"] = max([2] + [2 * s for s in stages if s > 1])
    cut["train"]["clients_per_round"] = 2
    for run in runs:
        algo = cut["algorithms"][run]
        if algo.get("warmup_rounds", 0) > 1:
            algo["warmup_rounds"] = 1
        if algo.get("initial_rounds", 0) > 2:
            algo["initial_rounds"] = 2
    cut["partition"].update(tiny.partition(raw["partition"]))
    cut["data"]["root"] = str(root)
    return raw, cut


def changed_keys(a: Any, b: Any, prefix: str = "") -> set[str]:
    """Dotted keys whose values differ between two nested mappings (added or removed too)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        keys = set(a) | set(b)
        return {k for key in keys for k in changed_keys(a.get(key), b.get(key), f"{prefix}{key}.")}
    return set() if a == b else {prefix.rstrip(".")}


def generic(key: str) -> str:
    parts = key.split(".")
    return ".".join(["algorithms", "*", *parts[2:]]) if parts[0] == "algorithms" else key


# --- the runs ----------------------------------------------------------------------------------


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Path, Path]]:
    """(a project directory as cwd with its own MLflow store and decode cache, a data root)."""
    project, root = tmp_path / "project", tmp_path / "data_root"
    project.mkdir()
    root.mkdir()
    monkeypatch.chdir(project)
    monkeypatch.setenv("FEDCOMM_PROJECT_ROOT", str(project))
    monkeypatch.setenv("FEDCOMM_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("FEDCOMM_DATA_ROOT", raising=False)
    yield project, root


def run_pipeline(params: Params) -> list[Path]:
    """partition -> train -> evaluate for every (run, seed) -> summarize; the report's files."""
    paths = Paths()
    partition_stage(params, paths)
    for run in params.experiment.runs:
        for seed in params.experiment.seeds:
            train_stage(params, run, seed, paths, show_progress=False)
            evaluate_stage(params, run, seed, paths)
    return summarize_stage(params, paths)


def check_outputs(params: Params, written: list[Path]) -> None:
    paths = Paths()
    metric = params.evaluate.metric
    for run in params.experiment.runs:
        for seed in params.experiment.seeds:
            rounds = pl.read_parquet(paths.train_dir(run, seed) / "rounds.parquet")
            expected = loop_config(params, seed, run).rounds  # train.rounds + warm-up rounds
            assert rounds["round"].to_list() == list(range(1, expected + 1)), run
            ledger = pl.read_parquet(paths.train_dir(run, seed) / "ledger.parquet")
            for direction in ("up", "down"):  # every round (0: before round 1, e.g. a mask)
                sent = ledger.filter(pl.col("direction") == direction)
                sent_in = set(sent["round"].to_list())
                assert set(range(1, expected + 1)) <= sent_in <= set(range(expected + 1)), run
                assert (sent["payload_bits"] > 0).all(), (run, direction)
            final = rounds.filter(pl.col(metric).is_not_null())[metric].to_list()
            assert final and all(0.0 <= a <= 1.0 for a in final), (run, final)
            summary = json.loads((paths.run_dir(run, seed) / "summary.json").read_text())
            saved = summary["saved_model"][metric]
            assert 0.0 <= saved <= 1.0 and saved == pytest.approx(final[-1], abs=1e-6), run
            assert (paths.run_dir(run, seed) / "eval_clients.parquet").is_file()
    report = paths.reports / "summary.md"
    assert report in written and report.is_file()
    text = report.read_text(encoding="utf-8")
    assert params.summarize.title in text
    assert all(run in text for run in params.experiment.runs)


#: ProgFed's cut is the slow one: ResNet-18 at 32x32 (about 1.7 GFLOP an image, forward and
#: backward), at least 20 images a client (20 classes each), T >= 2S = 8 rounds, 27 rounds over
#: its three runs; it did not finish within 13 minutes on a shared 2-core CPU (load ~8)
SLOW = {"progfed_cifar100"}


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else []) for n in TINY]
)
def test_paper_profile_runs_end_to_end_cut_down(
    name: str, workdir: tuple[Path, Path], recwarn: pytest.WarningsRecorder
) -> None:
    _, root = workdir
    raw, cut = cut_profile(name, root)
    assert {generic(k) for k in changed_keys(raw, cut)} <= CUT_KEYS
    profile, params = validate_params(raw, name), validate_params(cut, f"{name} (cut)")
    # what the cut keeps: the model, every run and its algorithm (up to W), the partition kind,
    # the local training, evaluation and what the report says
    assert params.model == profile.model and params.experiment.runs == profile.experiment.runs
    assert params.data.dataset.name == profile.data.dataset.name
    assert params.partition.kind == profile.partition.kind
    assert params.train.local == profile.train.local
    for run in params.experiment.runs:
        mine, theirs = params.algorithms[run], profile.algorithms[run]  # as written
        keep = {"warmup_rounds", "initial_rounds"}
        assert mine.model_dump(exclude=keep) == theirs.model_dump(exclude=keep), run
    assert params.evaluate == profile.evaluate and params.summarize == profile.summarize

    written = run_pipeline(params)
    check_outputs(params, written)
