"""Tests of the dataset registry and the offline loaders (real data from ../shared/data)."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path

import numpy as np
import pytest

from fedcomm.data.datasets import shakespeare, text
from fedcomm.data.datasets.mnist import read_idx
from fedcomm.data.datasets.registry import DATASETS, load_dataset, register, resolve_root
from fedcomm.data.datasets.verify import DATA_ROOT_ENV, DatasetNotFoundError

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data"


def shared(sub: str) -> Path:
    """The shared data root, skipping the test when ``sub`` is absent there."""
    if not (SHARED / sub).exists():
        pytest.skip(f"real data {SHARED / sub} is not available on this machine")
    return SHARED


# --- registry, roots, errors ---------------------------------------------------------------------


def test_registry_has_all_loaders() -> None:
    expected = {"digits", "mnist", "fashion_mnist", "femnist", "shakespeare", "ptb"}
    assert expected | {"cifar10", "cifar100", "synthetic"} <= set(DATASETS)


def test_unknown_dataset_lists_registered_names() -> None:
    with pytest.raises(ValueError, match="unknown dataset 'nope'") as exc:
        load_dataset("nope")
    assert "mnist" in str(exc.value) and "synthetic" in str(exc.value)


def test_register_rejects_duplicates() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register("digits")(DATASETS["digits"])


def test_resolve_root_prefers_explicit_then_env(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    assert resolve_root(None) is None
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path / "env"))
    assert resolve_root(None) == tmp_path / "env"
    assert resolve_root(tmp_path / "explicit") == tmp_path / "explicit"
    assert resolve_root(str(tmp_path)) == tmp_path


def test_env_root_is_used_by_load_dataset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _write_ptb(tmp_path / "ptb", "valid", ["a b c d e f g h"])
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path))
    assert load_dataset("ptb", seq_len=3).x.shape == (2, 3)


def test_missing_dataset_names_expected_paths(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as exc:
        load_dataset("mnist", tmp_path)
    msg = str(exc.value)
    assert str(tmp_path / "mnist" / "train-images-idx3-ubyte.gz") in msg
    assert str(tmp_path / "MNIST" / "raw") in msg and "data.root" in msg and DATA_ROOT_ENV in msg
    with pytest.raises(FileNotFoundError, match=r"cifar-10-batches-py/data_batch_1"):
        load_dataset("cifar10", tmp_path)
    with pytest.raises(DatasetNotFoundError, match=r"shakespeare/roles\.jsonl\.gz"):
        load_dataset("shakespeare", tmp_path)


def test_missing_root_says_how_to_set_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with pytest.raises(DatasetNotFoundError, match="no data root is set") as exc:
        load_dataset("femnist")
    assert "data.root in params.yaml" in str(exc.value) and "leaf/femnist/train" in str(exc.value)


def test_bad_options_raise_value_error() -> None:
    with pytest.raises(ValueError, match="unknown options"):
        load_dataset("digits", normalise=True)
    with pytest.raises(ValueError, match="num_users"):
        load_dataset("synthetic", num_users=0)
    with pytest.raises(ValueError, match="alpha"):
        load_dataset("synthetic", alpha=-1.0)
    with pytest.raises(ValueError, match="iid"):
        load_dataset("synthetic", iid="yes")


# --- bundled / generated -----------------------------------------------------------------------


def test_digits() -> None:
    ds = load_dataset("digits")
    assert ds.x.shape == (1797, 1, 8, 8) and ds.x.dtype == np.float32
    assert ds.y.dtype == np.int64 and set(np.unique(ds.y)) == set(range(10))
    assert ds.num_classes == 10 and ds.x.min() >= 0.0 and ds.x.max() == 1.0
    # read from scikit-learn's package data without importing it: exactly load_digits()
    from sklearn.datasets import load_digits

    bunch = load_digits()
    assert np.array_equal(ds.x[:, 0] * 16.0, bunch.images) and np.array_equal(ds.y, bunch.target)


def test_synthetic_is_deterministic_per_seed() -> None:
    a = load_dataset("synthetic", alpha=0.5, beta=0.5, seed=3)
    b = load_dataset("synthetic", alpha=0.5, beta=0.5, seed=3)
    c = load_dataset("synthetic", alpha=0.5, beta=0.5, seed=4)
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert a.x.dtype == np.float32 and a.x.shape[1] == 60 and a.y.dtype == np.int64
    assert a.natural_id is not None and a.natural_names is not None
    counts = np.bincount(a.natural_id, minlength=30)
    assert len(counts) == 30 == len(a.natural_names) and counts.min() >= 50
    assert np.all(np.diff(a.natural_id) >= 0)  # users are contiguous, in order
    assert a.y.min() >= 0 and a.y.max() < 10


def test_synthetic_options() -> None:
    ds = load_dataset("synthetic", num_users=4, dim=5, num_classes=3, min_samples=7, iid=True)
    assert ds.x.shape[1] == 5 and ds.num_classes == 3 and ds.y.max() < 3
    assert ds.natural_id is not None and np.bincount(ds.natural_id).min() >= 7


# --- IDX --------------------------------------------------------------------------------------


def _idx_bytes(arr: np.ndarray, code: int) -> bytes:
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes()
    return header + arr.tobytes()


@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_tiny(tmp_path: Path, compress: bool) -> None:
    imgs = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    raw = _idx_bytes(imgs, 0x08)
    path = tmp_path / ("x.idx.gz" if compress else "x.idx")
    path.write_bytes(gzip.compress(raw) if compress else raw)
    np.testing.assert_array_equal(read_idx(path), imgs)
    ints = np.array([1, -2, 70000], dtype=">i4")
    (tmp_path / "i.idx").write_bytes(_idx_bytes(ints, 0x0C))
    np.testing.assert_array_equal(read_idx(tmp_path / "i.idx"), [1, -2, 70000])


def test_read_idx_rejects_bad_files(tmp_path: Path) -> None:
    (tmp_path / "magic").write_bytes(b"\x01\x00\x08\x01\x00\x00\x00\x01\x05")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "magic")
    (tmp_path / "short").write_bytes(_idx_bytes(np.zeros(5, np.uint8), 0x08)[:-1])
    with pytest.raises(ValueError, match="header says"):
        read_idx(tmp_path / "short")


def test_fashion_mnist_from_torchvision_layout_uncompressed(tmp_path: Path) -> None:
    folder = tmp_path / "FashionMNIST" / "raw"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("t10k", 2)):
        imgs = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        (folder / f"{split}-images-idx3-ubyte").write_bytes(_idx_bytes(imgs, 0x08))
        labels = np.arange(n, dtype=np.uint8)
        (folder / f"{split}-labels-idx1-ubyte").write_bytes(_idx_bytes(labels, 0x08))
    ds = load_dataset("fashion_mnist", tmp_path)
    assert ds.x.shape == (5, 1, 28, 28) and ds.y.tolist() == [0, 1, 2, 0, 1]
    assert ds.x.min() >= 0.0 and ds.x.max() <= 1.0


def test_mnist_real() -> None:
    ds = load_dataset("mnist", shared("mnist"))
    assert ds.x.shape == (70000, 1, 28, 28) and ds.x.dtype == np.float32
    assert ds.y.dtype == np.int64 and ds.y[:5].tolist() == [5, 0, 4, 1, 9]
    assert np.bincount(ds.y).sum() == 70000 and len(np.bincount(ds.y)) == 10
    assert ds.x.min() == 0.0 and ds.x.max() == 1.0 and ds.num_classes == 10
    assert ds.y[60000:60005].tolist() == [7, 2, 1, 0, 4]  # first t10k labels follow train


# --- LEAF -------------------------------------------------------------------------------------


def test_femnist_real() -> None:
    ds = load_dataset("femnist", shared("leaf/femnist"))
    assert ds.x.shape == (14708 + 4088, 1, 28, 28) and ds.x.dtype == np.float32
    assert ds.num_classes == 62 and ds.y.max() <= 61
    assert ds.natural_id is not None and ds.natural_names is not None
    assert len(ds.natural_names) == 184 == len(np.unique(ds.natural_id))
    assert ds.natural_names[0] == "f3313_11"  # first writer of the train shard


def test_femnist_invert_and_writer_order(tmp_path: Path) -> None:
    def user(v: float, n: int) -> dict[str, list[list[float]] | list[int]]:
        return {"x": [[v] * 784] * n, "y": list(range(n))}

    splits = {
        "train": {"w2": user(1.0, 2), "w1": user(0.5, 1)},
        "test": {"w1": user(0.25, 1), "w3": user(0.0, 1)},
    }
    for split, users in splits.items():
        blob = {"users": list(users), "num_samples": [1] * len(users), "user_data": users}
        (tmp_path / "femnist" / split).mkdir(parents=True)
        (tmp_path / "femnist" / split / "shard.json").write_text(json.dumps(blob))
    ds = load_dataset("femnist", tmp_path, invert=True)
    assert ds.natural_names == ("w2", "w1", "w3")
    assert ds.natural_id is not None and ds.natural_id.tolist() == [0, 0, 1, 1, 2]
    np.testing.assert_allclose(ds.x[:, 0, 0, 0], [0.0, 0.0, 0.5, 0.75, 1.0])


def test_shakespeare_roles_next_char() -> None:
    ds = load_dataset("shakespeare", shared("shakespeare"), max_roles=4)
    assert ds.task == "next_token" and ds.num_classes == 80 == len(ds.vocab or ())
    assert ds.x.shape[1] == 80 and ds.y.shape == (len(ds.x),) and ds.x.dtype == np.int64
    assert ds.natural_names is not None and len(ds.natural_names) == 4
    assert all("/" in name for name in ds.natural_names)
    assert ds.natural_id is not None and set(ds.natural_id.tolist()) == {0, 1, 2, 3}
    assert np.bincount(ds.natural_id).min() >= 2
    # Non-overlapping windows: the target of window i is the first id of window i + 1.
    same = ds.natural_id[1:] == ds.natural_id[:-1]
    np.testing.assert_array_equal(ds.y[:-1][same], ds.x[1:, 0][same])


def test_shakespeare_roles_next_word() -> None:
    root = shared("shakespeare")
    ds = load_dataset("shakespeare", root, target="next_word", max_roles=3, vocab_size=500)
    assert ds.x.shape[1] == 20 and ds.y.shape == ds.x.shape
    np.testing.assert_array_equal(ds.y[:, :-1], ds.x[:, 1:])
    assert ds.vocab is not None and ds.vocab[:2] == ("<pad>", "<unk>") and ds.num_classes <= 500
    assert ds.x.max() < ds.num_classes and ds.natural_names is not None
    assert len(ds.natural_names) == 3
    ds8 = load_dataset("shakespeare", root, target="next_word", max_roles=3, seq_len=8, stride=4)
    assert ds8.x.shape[1] == 8 and len(ds8) > 2 * len(ds)


def test_shakespeare_prefers_leaf_json(tmp_path: Path) -> None:
    users = {"A_KING": {"x": ["ab c", "b cd"], "y": ["d", "!"]}, "B_Q": {"x": ["zz@z"], "y": ["a"]}}
    blob = {"users": list(users), "num_samples": [2, 1], "user_data": users}
    (tmp_path / "shakespeare" / "train").mkdir(parents=True)
    with gzip.open(tmp_path / "shakespeare" / "train" / "s.json.gz", "wt") as f:
        json.dump(blob, f)
    ds = load_dataset("shakespeare", tmp_path, min_samples=1)
    assert ds.x.shape == (3, 4) and ds.natural_names == ("A_KING", "B_Q")
    letters = shakespeare.SHAKESPEARE_LETTERS
    assert "".join(letters[i] for i in ds.x[2]) == "zz z"  # unknown '@' becomes a space
    assert "".join(letters[i] for i in ds.y) == "d!a"
    assert load_dataset("shakespeare", tmp_path).natural_names == ("A_KING",)  # min_samples=2


def test_text_windows() -> None:
    ids = np.arange(10)
    x, y = text.char_windows(ids, 3, 3)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and y.tolist() == [3, 6, 9]
    x, y = text.sequence_windows(ids, 3, 3)
    assert x.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and y[:, -1].tolist() == [3, 6, 9]
    assert text.num_windows(10, 3, 3) == 3 == len(x) and text.num_windows(3, 3, 1) == 0
    assert shakespeare.tokenize_words("'Tis so, my LORD's-man!") == [
        "tis",
        "so",
        "my",
        "lord's",
        "man",
    ]
    vocab = text.build_vocab([["b", "a", "b", "c"]], specials=("<pad>",), max_size=3)
    assert vocab == ("<pad>", "b", "a")


# --- PTB --------------------------------------------------------------------------------------


def _write_ptb(folder: Path, split: str, lines: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"ptb.{split}.txt").write_text("".join(f" {line} \n" for line in lines))


def test_ptb_real() -> None:
    ds = load_dataset("ptb", shared("ptb"))
    assert ds.vocab is not None and "<eos>" in ds.vocab and "<unk>" in ds.vocab
    assert ds.x.shape[1] == 35 and ds.y.shape == ds.x.shape and ds.task == "next_token"
    np.testing.assert_array_equal(ds.y[:, :-1], ds.x[:, 1:])
    assert ds.num_classes == len(ds.vocab) and ds.x.max() < ds.num_classes
    assert ds.natural_id is None
    # The full PTB: train, valid and test (887,521 / 70,390 / 78,669 words, i.e. 929,589 /
    # 73,760 / 82,430 tokens with one <eos> per line) are cut separately into 35 + 1 token
    # windows; the vocabulary is train's 9,999 word types and <eos>, and covers valid and test.
    assert len(ds) == (929589 - 1) // 35 + (73760 - 1) // 35 + (82430 - 1) // 35 == 31021
    assert ds.num_classes == 10_000
    # train comes first: the first window is the first 35 tokens of ptb.train.txt
    lines = (shared("ptb") / "ptb" / "ptb.train.txt").read_text().splitlines()[:5]
    first = [w for line in lines for w in [*line.split(), "<eos>"]][:35]
    assert [ds.vocab[i] for i in ds.x[0]] == first


def test_ptb_vocab_order_and_windows(tmp_path: Path) -> None:
    _write_ptb(tmp_path, "train", ["b a b", "c"])  # directly under the root
    ds = load_dataset("ptb", tmp_path, seq_len=2)
    assert ds.vocab == ("<eos>", "b", "a", "c")  # eos and b twice, then alphabetical
    # stream b a b <eos> c <eos> = 1 2 1 0 3 0; windows of 3 ids start every 2 ids
    assert ds.x.tolist() == [[1, 2], [1, 0]] and ds.y.tolist() == [[2, 1], [0, 3]]


# --- CIFAR ------------------------------------------------------------------------------------


def _pickle(path: Path, obj: dict[bytes, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(obj))


def test_cifar10_fake_batches(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-10-batches-py"
    names = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]
    for k, name in enumerate(names):
        data = np.full((2, 3072), 51 * (k % 6), dtype=np.uint8)
        data[:, 1024:] = 255  # green and blue planes
        _pickle(folder / name, {b"data": data, b"labels": [k, 9 - k]})
    ds = load_dataset("cifar10", tmp_path)
    assert ds.x.shape == (12, 3, 32, 32) and ds.x.dtype == np.float32
    assert ds.y.tolist()[:4] == [0, 9, 1, 8] and ds.y[-2:].tolist() == [5, 4]
    assert ds.x[2, 0].max() == pytest.approx(0.2) and ds.x[:, 1:].min() == 1.0


def test_cifar100_fine_and_coarse(tmp_path: Path) -> None:
    for name, fine in (("train", [99, 3, 4]), ("test", [7])):
        data = np.zeros((len(fine), 3072), dtype=np.uint8)
        batch = {b"data": data, b"fine_labels": fine, b"coarse_labels": [f // 5 for f in fine]}
        _pickle(tmp_path / "cifar-100-python" / name, batch)
    fine_ds = load_dataset("cifar100", tmp_path)
    assert fine_ds.num_classes == 100 and fine_ds.y.tolist() == [99, 3, 4, 7]
    coarse = load_dataset("cifar100", tmp_path, label="coarse")
    assert coarse.num_classes == 20 and coarse.y.tolist() == [19, 0, 0, 1]
    with pytest.raises(ValueError, match="label"):
        load_dataset("cifar100", tmp_path, label="medium")


def test_cifar_normalize_standardizes_each_channel(tmp_path: Path) -> None:
    """``normalize: {mean, std}``: torchvision's Normalize after the scaling to [0, 1] (the
    official FedDST code's CIFAR-10 preprocessing); absent: pixels stay in [0, 1]."""
    folder = tmp_path / "cifar-10-batches-py"
    for k, name in enumerate([*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]):
        data = np.zeros((1, 3072), dtype=np.uint8)
        data[0, :1024], data[0, 1024:2048], data[0, 2048:] = 51 * (k % 6), 255, 0  # R, G, B
        _pickle(folder / name, {b"data": data, b"labels": [k]})
    stats = {"mean": [0.5, 0.25, 0.0], "std": [0.5, 0.25, 2.0]}
    plain = load_dataset("cifar10", tmp_path)
    ds = load_dataset("cifar10", tmp_path, normalize=stats)
    expect = (plain.x - np.array([0.5, 0.25, 0.0], np.float32)[:, None, None]) / np.array(
        [0.5, 0.25, 2.0], np.float32
    )[:, None, None]
    np.testing.assert_allclose(ds.x, expect, rtol=1e-6)
    assert ds.x[1, 0, 0, 0] == pytest.approx((0.2 - 0.5) / 0.5) and ds.x[0, 1].min() == 3.0
    assert plain.x.min() == 0.0 and plain.x.max() == 1.0
    for bad in ({"mean": [0.5], "std": [0.5]}, {"mean": [0, 0, 0], "std": [1, 0, 1]},
                {"mean": [0, 0, 0]}, [0.5, 0.5]):  # fmt: skip
        with pytest.raises(ValueError, match="normalize"):
            load_dataset("cifar10", tmp_path, normalize=bad)
