"""Fault injection on the dataset files the loaders read: each file missing, empty, truncated,
corrupted and of another format ends `fedcomm partition` with one `error:` line that names the
file and the remedy, exit status 2, no traceback and no partition written. Unit-level cases cover
what the command cannot reach cheaply (CIFAR, Fashion-MNIST, LEAF Shakespeare, `verify`)."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.data.datasets.mnist import read_idx
from fedcomm.data.datasets.registry import load_dataset
from fedcomm.data.datasets.verify import DATA_ROOT_ENV, DatasetFileError
from fedcomm.errors import InputError
from fedcomm.paths import CACHE_ENV
from tests.conftest import tiny_params
from tests.image_folders import DAMAGES, write_image_folder

pytestmark = pytest.mark.slow

FEMNIST_TEST = "leaf/femnist/test/all_data_0_niid_05_keep_0_test_9.json.gz"
MNIST_GZ = [
    f"mnist/{n}-idx{d}-ubyte.gz"
    for n, d in (("train-images", 3), ("train-labels", 1), ("t10k-images", 3), ("t10k-labels", 1))
]
REPLACE = "replace it with a fresh copy of"
DOCS = "(see docs/configuration.md)"


# --- building a damaged data root ------------------------------------------------------------


def _copy(shared: Path, src: str, dest: Path) -> None:
    """Copy ``shared/src`` to ``dest`` (writable); a ``.gz`` source to a plain ``dest`` is
    gunzipped."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.endswith(".gz") and dest.suffix != ".gz":
        dest.write_bytes(gzip.decompress((shared / src).read_bytes()))
    else:
        shutil.copyfile(shared / src, dest)


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt(path: Path) -> None:
    """XOR every 7th byte past the magic header (gzip's 10 bytes, IDX's magic and dims)."""
    data = bytearray(path.read_bytes())
    start = 10 if path.suffix == ".gz" else 16 if "idx" in path.name else 0
    for i in range(start, len(data), 7):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def _other_idx(name: str) -> Callable[[Path, Path], None]:
    """Another standard IDX file (``name`` of the shared root) in the file's place."""

    def put(path: Path, shared: Path) -> None:
        _copy(shared, f"mnist/{name}.gz", path)

    return put


def _leaf_without_users(path: Path, shared: Path) -> None:  # another LEAF layout: no 'users'
    blob = gzip.decompress((shared / FEMNIST_TEST).read_bytes())
    assert blob.count(b'"users"') == 1
    path.write_bytes(gzip.compress(blob.replace(b'"users"', b'"writers"'), 1))


def _roles_other_keys(path: Path, shared: Path) -> None:  # a JSONL of another layout
    lines = gzip.decompress((shared / "shakespeare/roles.jsonl.gz").read_bytes()).splitlines()
    recs = [json.loads(line) for line in lines[:50]]
    other = [{"work": r["play"], "speaker": r["role"], "lines": r["text"]} for r in recs]
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in other).encode()))


def _ptb_other_text(path: Path, shared: Path) -> None:  # another corpus's text in its place
    lines = gzip.decompress((shared / "shakespeare/roles.jsonl.gz").read_bytes()).splitlines()
    text = "".join(json.loads(line)["text"] + "\n" for line in lines[:50])
    path.write_text(text, encoding="utf-8")


@dataclass(frozen=True)
class DataFile:
    """One file to damage: its place under the data root and how to build that root."""

    rel: str  # the damaged file, relative to the data root
    dataset: dict[str, Any]  # params' data.dataset
    wrong_version: Callable[[Path, Path], None]  # (file, shared root): another format there
    missing_names: str  # what the error names when the file is missing
    copies: dict[str, str] = field(default_factory=dict)  # dest -> shared source (incl. rel)


FILES = {
    "mnist-train-images.gz": DataFile(
        MNIST_GZ[0],
        {"name": "mnist"},
        _other_idx("train-labels-idx1-ubyte"),
        "mnist/train-images-idx3-ubyte.gz",
        {p: p for p in MNIST_GZ},
    ),
    "mnist-t10k-labels.gz": DataFile(
        MNIST_GZ[3],
        {"name": "mnist"},
        _other_idx("t10k-images-idx3-ubyte"),
        "mnist/t10k-labels-idx1-ubyte.gz",
        {p: p for p in MNIST_GZ},
    ),
    "mnist-t10k-images-raw": DataFile(
        "mnist/t10k-images-idx3-ubyte",
        {"name": "mnist"},
        _other_idx("t10k-labels-idx1-ubyte"),
        "mnist/t10k-images-idx3-ubyte",
        {
            **{p: p for p in MNIST_GZ if "t10k-images" not in p},
            "mnist/t10k-images-idx3-ubyte": "mnist/t10k-images-idx3-ubyte.gz",
        },
    ),
    "femnist-shard": DataFile(
        FEMNIST_TEST,
        {"name": "femnist"},
        _leaf_without_users,
        "leaf/femnist/test",  # LEAF shards have free names: the error names their folder
        {FEMNIST_TEST: FEMNIST_TEST},
    ),
    "shakespeare-roles": DataFile(
        "shakespeare/roles.jsonl.gz",
        {"name": "shakespeare", "max_roles": 4},
        _roles_other_keys,
        "shakespeare/roles.jsonl.gz",
        {"shakespeare/roles.jsonl.gz": "shakespeare/roles.jsonl.gz"},
    ),
    "ptb-valid": DataFile(
        "ptb/ptb.valid.txt",
        {"name": "ptb"},
        _ptb_other_text,
        "ptb/ptb.valid.txt",
        {"ptb/ptb.valid.txt": "ptb/ptb.valid.txt"},
    ),
}
FAULTS: dict[str, Callable[[Path], None]] = {
    "missing": lambda p: p.unlink(),
    "empty": lambda p: p.write_bytes(b""),
    "truncated": _truncate,
    "corrupted": _corrupt,
}
CASES = [(f, k) for f in FILES for k in [*FAULTS, "wrong_version"]]


def _data_root(shared: Path, root: Path, spec: DataFile) -> Path:
    for dest, src in spec.copies.items():
        _copy(shared, src, root / dest)
    return root


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty project directory (cwd) and an empty data root (``$FEDCOMM_DATA_ROOT``)."""
    root = tmp_path / "project"
    root.mkdir()
    (tmp_path / "data_root").mkdir()
    monkeypatch.chdir(root)
    monkeypatch.setenv("FEDCOMM_PROJECT_ROOT", str(root))
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path / "data_root"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return root


@pytest.mark.parametrize(("name", "fault"), CASES, ids=[f"{f}-{k}" for f, k in CASES])
def test_a_damaged_dataset_file_is_named_not_a_traceback(
    project: Path, data_root: Path, name: str, fault: str
) -> None:
    spec = FILES[name]
    root = _data_root(data_root, project.parent / "data_root", spec)
    path = root / spec.rel
    assert path.is_file() and data_root not in path.parents  # never damage the shared copy
    if fault == "wrong_version":
        spec.wrong_version(path, data_root)
    else:
        FAULTS[fault](path)
    params = tiny_params(**{"data.dataset": spec.dataset})
    (project / "params.yaml").write_text(yaml.safe_dump(params))

    res = CliRunner().invoke(app, ["partition"])
    out = res.output.strip()
    assert res.exit_code == 2, out
    assert out.startswith("error: ") and "\n" not in out and "Traceback" not in out, out
    if fault == "missing":
        assert spec.missing_names in out and "set data.root in params.yaml" in out, out
    else:
        assert f"{path}: " in out and REPLACE in out and DOCS in out, out
    assert not (project / "data").exists()  # nothing half-written


@pytest.mark.parametrize("name", list(FILES))
def test_the_undamaged_copies_load(data_root: Path, tmp_path: Path, name: str) -> None:
    """The same data roots, undamaged, load: every failure above is the damage's."""
    spec = FILES[name]
    root = _data_root(data_root, tmp_path, spec)
    options = {k: v for k, v in spec.dataset.items() if k != "name"}
    assert len(load_dataset(spec.dataset["name"], root, **options)) > 0


# --- unit level: what the command does not reach cheaply ---------------------------------------


def _raw_mnist(shared: Path, root: Path) -> Path:
    """A data root with MNIST, its t10k images uncompressed (checked by digest, not gzip's CRC)."""
    _data_root(shared, root, FILES["mnist-t10k-images-raw"])
    return root / "mnist" / "t10k-images-idx3-ubyte"


def test_dataset_file_error_is_an_input_error_and_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "ptb").mkdir()
    (tmp_path / "ptb" / "ptb.valid.txt").write_text(" a b c \n d e")  # cut mid-line
    with pytest.raises(DatasetFileError, match=r"ptb\.valid\.txt: ends mid-line") as exc:
        load_dataset("ptb", tmp_path)
    assert isinstance(exc.value, InputError) and isinstance(exc.value, ValueError)


def test_a_modified_standard_mnist_file_fails_its_digest_unless_verify_is_off(
    data_root: Path, tmp_path: Path
) -> None:
    path = _raw_mnist(data_root, tmp_path)
    data = bytearray(path.read_bytes())
    data[16 + 14 * 28 + 14] ^= 0x01  # one pixel of the first test image: a plausible file
    path.write_bytes(bytes(data))
    with pytest.raises(DatasetFileError) as exc:
        load_dataset("mnist", tmp_path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: MD5 ") and "2646ac647ad5339dbf082846283269ea" in msg
    assert "set data.dataset.verify: false to use your own copy" in msg and "\n" not in msg
    assert load_dataset("mnist", tmp_path, verify=False).x[60000, 0, 14, 14] >= 0.0


def test_images_and_labels_of_different_counts_name_the_labels_file(
    data_root: Path, tmp_path: Path
) -> None:
    _data_root(data_root, tmp_path, FILES["mnist-train-images.gz"])
    labels = tmp_path / "mnist" / "train-labels-idx1-ubyte.gz"
    _copy(data_root, "mnist/t10k-labels-idx1-ubyte.gz", labels)  # a valid file, the wrong split
    with pytest.raises(DatasetFileError, match="10000 labels for the 60000 images") as exc:
        load_dataset("mnist", tmp_path)
    assert str(exc.value).startswith(f"{labels}: ")


def _idx_bytes(arr: np.ndarray, code: int = 0x08) -> bytes:
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes()
    return header + arr.tobytes()


def _fake_fashion(root: Path, labels: np.ndarray | None = None) -> Path:
    """Tiny Fashion-MNIST IDX files (uncompressed) in the torchvision layout."""
    folder = root / "FashionMNIST" / "raw"
    folder.mkdir(parents=True)
    for split in ("train", "t10k"):
        imgs = np.zeros((3, 28, 28), np.uint8)
        (folder / f"{split}-images-idx3-ubyte").write_bytes(_idx_bytes(imgs))
        y = np.arange(3, dtype=np.uint8) if labels is None else labels
        (folder / f"{split}-labels-idx1-ubyte").write_bytes(_idx_bytes(y))
    return folder


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda f: _truncate(f / "train-images-idx3-ubyte"), r"images-idx3-ubyte: truncated: "),
        (lambda f: (f / "t10k-labels-idx1-ubyte").write_bytes(b"PK\x03\x04"), "not an IDX file"),
        (
            lambda f: (f / "t10k-labels-idx1-ubyte").write_bytes(
                gzip.compress(_idx_bytes(np.arange(3, dtype=np.uint8)))
            ),
            r"its name must end in \.gz",
        ),
        (
            lambda f: (f / "train-labels-idx1-ubyte").write_bytes(
                _idx_bytes(np.arange(3, dtype=">i4"), 0x0C)
            ),
            r"labels-idx1-ubyte: holds an IDX array \(3,\) >i4, not uint8 labels",
        ),
    ],
    ids=["truncated", "zip", "gzip-named-plain", "int32-labels"],
)
def test_damaged_fashion_mnist_files(
    tmp_path: Path, damage: Callable[[Path], None], match: str
) -> None:
    damage(_fake_fashion(tmp_path))
    with pytest.raises(DatasetFileError, match=match) as exc:
        load_dataset("fashion_mnist", tmp_path)
    assert "a fresh copy of the standard Fashion-MNIST file" in str(exc.value)


def test_labels_out_of_range_are_damage(tmp_path: Path) -> None:
    _fake_fashion(tmp_path, labels=np.array([1, 2, 0x5F], np.uint8))
    with pytest.raises(DatasetFileError, match=r"labels outside 0\.\.9 \(up to 95\)"):
        load_dataset("fashion_mnist", tmp_path)


def test_read_idx_names_a_raw_file_called_gz(tmp_path: Path) -> None:
    path = tmp_path / "x-idx1-ubyte.gz"
    path.write_bytes(_idx_bytes(np.arange(3, dtype=np.uint8)))
    with pytest.raises(DatasetFileError, match=r"x-idx1-ubyte\.gz: not gzip-compressed"):
        read_idx(path)


# --- PTB ---------------------------------------------------------------------------------------


def _ptb(root: Path, content: bytes, split: str = "valid") -> Path:
    path = root / "ptb" / f"ptb.{split}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_ptb_checks_the_standard_alphabet_unless_verify_is_off(tmp_path: Path) -> None:
    path = _ptb(tmp_path, b" Our own Corpus , with Capitals \n and more \n")
    with pytest.raises(DatasetFileError, match=r"character 'O' on line 1") as exc:
        load_dataset("ptb", tmp_path, seq_len=2)
    assert f"{path}: " in str(exc.value) and "verify: false" in str(exc.value)
    assert load_dataset("ptb", tmp_path, seq_len=2, verify=False).vocab is not None


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (b" a b \xff c \n", r"not UTF-8 text \('utf-8' codec can't decode byte 0xff"),
        (b" a b \n c \x00 d \n", r"control character '\\x00' on line 2: corrupted"),
        (b" a b \n c d", "ends mid-line"),
    ],
    ids=["not-utf8", "control", "no-final-newline"],
)
def test_ptb_damage_is_found_even_with_verify_off(
    tmp_path: Path, content: bytes, match: str
) -> None:
    _ptb(tmp_path, content)
    with pytest.raises(DatasetFileError, match=match):
        load_dataset("ptb", tmp_path, verify=False)


@pytest.mark.parametrize(
    ("split", "md5", "tokens"),
    [
        ("train", "f26c4b92c5fdc7b3f8c7cdcb991d8420", 929589),
        ("valid", "aa0affc06ff7c36e977d7cd49e3839bf", 73760),
        ("test", "8b80168b89c18661a38ef683c0dc3721", 82430),
    ],
)
def test_a_modified_standard_ptb_file_fails_its_digest(
    data_root: Path, tmp_path: Path, split: str, md5: str, tokens: int
) -> None:
    text = (data_root / "ptb" / f"ptb.{split}.txt").read_bytes()
    path = _ptb(tmp_path, text.replace(b" the ", b" tha ", 1), split)  # same size and alphabet
    with pytest.raises(DatasetFileError, match=md5) as exc:
        load_dataset("ptb", tmp_path)
    assert str(exc.value).startswith(f"{path}: MD5 ")
    assert len(load_dataset("ptb", tmp_path, verify=False)) > 0
    _ptb(tmp_path, text, split)
    assert len(load_dataset("ptb", tmp_path)) == (tokens - 1) // 35  # the real file passes


# --- LEAF and roles ----------------------------------------------------------------------------


def _leaf(root: Path, base: str, users: dict[str, Any]) -> Path:
    path = root / base / "train" / "shard.json.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {"users": list(users), "num_samples": [1] * len(users), "user_data": users}
    path.write_bytes(gzip.compress(json.dumps(blob).encode()))
    return path


@pytest.mark.parametrize(
    ("users", "match"),
    [
        ({"w": {"x": [[0.5] * 783], "y": [3]}}, r"user 'w': x \(1, 783\)"),
        ({"w": {"x": [[0.5] * 784], "y": [62]}}, r"user 'w': labels outside 0\.\.61"),
        ({"w": {"y": [1]}}, r"user 'w': needs 'x' and 'y' lists of numbers"),
        ({"w": [1, 2]}, r"user 'w' in 'users' has no record"),
        ({}, r"'users' must be a non-empty list"),
    ],
    ids=["short-rows", "label", "no-x", "record-not-object", "no-users"],
)
def test_bad_femnist_records_name_the_shard(
    tmp_path: Path, users: dict[str, Any], match: str
) -> None:
    path = _leaf(tmp_path, "femnist", users)
    with pytest.raises(DatasetFileError, match=match) as exc:
        load_dataset("femnist", tmp_path)
    assert str(exc.value).startswith(f"{path}: ") and "LEAF FEMNIST shard, or remove it" in str(
        exc.value
    )


@pytest.mark.parametrize("fault", ["empty", "truncated", "corrupted", "ragged"])
def test_damaged_leaf_shakespeare_shards_are_named(tmp_path: Path, fault: str) -> None:
    ys = ["d", "!"] if fault != "ragged" else ["d", "!!"]
    path = _leaf(tmp_path, "shakespeare", {"A_KING": {"x": ["ab c", "b cd"], "y": ys}})
    if fault != "ragged":
        FAULTS[fault](path)
    with pytest.raises(DatasetFileError) as exc:
        load_dataset("shakespeare", tmp_path, min_samples=1)
    assert str(exc.value).startswith(f"{path}: ") and "LEAF Shakespeare shard" in str(exc.value)


@pytest.mark.parametrize(
    ("lines", "match"),
    [
        (b'{"play": "p", "role": "r", "text": "t"}\n{"play": "p", "role"\n', "line 2: not valid"),
        (b'{"play": "p", "role": "r", "text": "t"}\n["p", "r", "t"]\n', "line 2: expected"),
        (b"\n\n", "holds no roles"),
        (b'{"play": "p", "role": "r", "text": "\xe9"}\n', "not UTF-8 text"),
    ],
    ids=["json", "array", "no-roles", "latin1"],
)
def test_bad_roles_lines_are_named(tmp_path: Path, lines: bytes, match: str) -> None:
    path = tmp_path / "shakespeare" / "roles.jsonl.gz"
    path.parent.mkdir()
    path.write_bytes(gzip.compress(lines))
    with pytest.raises(DatasetFileError, match=match) as exc:
        load_dataset("shakespeare", tmp_path)
    assert str(exc.value).startswith(f"{path}: ")


def test_damage_past_max_roles_is_still_found(data_root: Path, tmp_path: Path) -> None:
    """The whole roles file is read, whatever ``max_roles`` keeps."""
    path = tmp_path / "shakespeare" / "roles.jsonl.gz"
    path.parent.mkdir()
    lines = gzip.decompress((data_root / "shakespeare" / "roles.jsonl.gz").read_bytes())
    path.write_bytes(gzip.compress(lines + b"{not json\n", 1))
    with pytest.raises(DatasetFileError, match=r"line 1336: not valid JSON"):
        load_dataset("shakespeare", tmp_path, max_roles=2)


# --- CIFAR (no real copy in the shared data root: fake batches) --------------------------------

CIFAR10 = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]


def _cifar10(root: Path, rows: int = 2) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for k, name in enumerate(CIFAR10):
        data = np.full((rows if k == 0 else 2, 3072), k, dtype=np.uint8)
        batch = {b"data": data, b"labels": [k % 10] * len(data), b"batch_label": b"fake"}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    return folder / CIFAR10[0]


def _cifar_wrong_version(path: Path) -> None:  # a CIFAR-100 batch in a CIFAR-10 place
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"fine_labels": [1, 2]}))


@pytest.mark.parametrize("fault", ["empty", "truncated", "corrupted", "wrong_version", "labels"])
def test_damaged_cifar_batches_are_named(tmp_path: Path, fault: str) -> None:
    path = _cifar10(tmp_path, rows=200)
    if fault == "wrong_version":
        _cifar_wrong_version(path)
    elif fault == "labels":
        path.write_bytes(pickle.dumps({b"data": np.zeros((1, 3072), np.uint8), b"labels": [10]}))
    else:
        FAULTS[fault](path)
    with pytest.raises(DatasetFileError) as exc:
        load_dataset("cifar10", tmp_path)
    msg = str(exc.value)
    assert msg.startswith(f"{path}: ") and "\n" not in msg, msg
    assert "a fresh copy of the standard CIFAR-10 python batch" in msg, msg


def test_a_standard_sized_cifar_batch_must_match_its_digest(tmp_path: Path) -> None:
    path = _cifar10(tmp_path, rows=10000)  # the standard row count, not the standard bytes
    with pytest.raises(DatasetFileError, match="c99cafc152244af753f735de768cd75f") as exc:
        load_dataset("cifar10", tmp_path)
    assert str(exc.value).startswith(f"{path}: MD5 ") and "verify: false" in str(exc.value)
    assert len(load_dataset("cifar10", tmp_path, verify=False)) == 10000 + 5 * 2


# --- ImageFolder: bad images through the command ----------------------------------------------


def _image_folder_project(project: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """``project``'s data root with a tiny ImageFolder ``imgs`` and params loading it; returns
    (the folder, the decode cache dir)."""
    folder = write_image_folder(project.parent / "data_root" / "imgs", per_class=(12, 4))
    cache = project.parent / "cache"
    monkeypatch.setenv(CACHE_ENV, str(cache))
    params = tiny_params(
        **{
            "data.dataset": {"name": "image_folder", "path": "imgs"},
            "partition": {"kind": "iid", "num_partitions": 4, "seed": 0},
            "model": {"name": "cnn"},
        }
    )
    (project / "params.yaml").write_text(yaml.safe_dump(params))
    return folder, cache


@pytest.mark.parametrize("bad", list(DAMAGES))
def test_a_bad_image_folder_is_named_in_one_line_and_nothing_is_written(
    project: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    folder, cache = _image_folder_project(project, monkeypatch)
    damage, message = DAMAGES[bad]
    damage(folder)
    for command in (["partition"], ["config", "validate"]):
        res = CliRunner().invoke(app, command)
        out = res.output.strip()
        assert res.exit_code == 2, out
        assert out.startswith(f"error: {folder}/") and message in out, out
        assert "\n" not in out and "Traceback" not in out, out
    assert not (project / "data").exists()  # no partition
    assert not list(cache.rglob("*.npz")) and not list(cache.rglob("*.tmp"))  # no cache file


def test_the_undamaged_image_folder_partitions_and_is_cached(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same folder, undamaged, goes through: every failure above is the damage's."""
    _, cache = _image_folder_project(project, monkeypatch)
    res = CliRunner().invoke(app, ["partition"])
    assert res.exit_code == 0, res.output
    assert (project / "data" / "partition" / "manifest.json").is_file()
    assert len(list(cache.rglob("*.npz"))) == 1


# --- known limits: damage no check can see (documented, not skipped) ---------------------------


def test_undetectable_a_missing_shard_or_split_among_others(
    data_root: Path, tmp_path: Path
) -> None:
    """LEAF shards have free names and PTB loads whichever splits exist, so a file missing
    beside others of its dataset is not an error: the dataset is built from the rest."""
    _copy(data_root, "ptb/ptb.test.txt", tmp_path / "ptb" / "ptb.test.txt")  # valid is gone
    assert len(load_dataset("ptb", tmp_path)) == (82430 - 1) // 35
    _leaf(tmp_path, "femnist", {"w": {"x": [[0.5] * 784], "y": [3]}})  # test shards are gone
    assert load_dataset("femnist", tmp_path).natural_names == ("w",)


def test_undetectable_a_changed_jpeg_byte_that_still_decodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """JPEG has no checksum: a changed byte in the coded data may decode to other pixels
    without an error. Only a known release's digest (``verify``) sees it; a user's own folder
    loads with the changed pixels."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    folder = write_image_folder(tmp_path / "imgs", per_class=(1, 1))
    before = load_dataset("image_folder", tmp_path, path="imgs")
    img = folder / "train" / "cat" / "0000.jpg"
    data = bytearray(img.read_bytes())
    data[-40] ^= 0x01  # inside the entropy-coded data, before the end marker
    img.write_bytes(bytes(data))
    after = load_dataset("image_folder", tmp_path, path="imgs")
    assert not np.array_equal(before.x[0], after.x[0])
    np.testing.assert_array_equal(before.x[1:], after.x[1:])


def test_undetectable_a_ptb_file_cut_at_a_line_end(data_root: Path, tmp_path: Path) -> None:
    """A cut exactly after a newline leaves a whole-looking file of non-standard size."""
    text = (data_root / "ptb" / "ptb.valid.txt").read_bytes()
    _ptb(tmp_path, text[: text.index(b"\n", len(text) // 2) + 1])
    assert 0 < len(load_dataset("ptb", tmp_path)) < (73760 - 1) // 35
