"""Dataset registry and offline loaders for standard on-disk formats.

Nothing here downloads anything: every dataset but ``digits`` and ``synthetic`` is read from a
data root (``data.root`` in ``params.yaml`` or ``$FEDCOMM_DATA_ROOT``) in its original format,
and a missing one raises :class:`DatasetNotFoundError` naming the files to put where. Loaders pool
the official train and test splits into one :class:`Dataset`, train first.

========================  ===================================================================
name                      files under the data root
========================  ===================================================================
``digits``                none (scikit-learn's bundled 8x8 digits)
``mnist``                 4 IDX files (``.gz`` or plain) in ``mnist/``, ``MNIST/raw/`` or ``./``
``fashion_mnist``         4 IDX files in ``fashion_mnist/`` or ``FashionMNIST/raw/``
``femnist``               LEAF JSON ``leaf/femnist/{train,test}/*.json[.gz]`` (or ``femnist/``)
``shakespeare``           LEAF JSON ``shakespeare/{train,test}/*.json[.gz]`` or
                          ``shakespeare/roles.jsonl.gz``
``ptb``                   ``ptb/ptb.{train,valid,test}.txt`` (or in ``./``), any present
``cifar10``/``cifar100``  python pickles in ``cifar-10-batches-py/`` / ``cifar-100-python/``
``synthetic``             none (FedProx Synthetic(alpha, beta))
========================  ===================================================================

Choices: unknown option names raise ``ValueError`` (catches typos); ``shakespeare`` with
``target="next_word"`` always reads ``roles.jsonl.gz`` (LEAF JSON holds next-char windows only);
FEMNIST writers are numbered by first appearance over the sorted train files, then the test files;
``synthetic`` draws x from the diagonal Gaussian directly (same law as the reference's
``multivariate_normal``) with :func:`numpy.random.default_rng`, so values differ from the
reference script for the same seed. CIFAR pickles are trusted local files (``pickle.load``).
Text-specific choices are documented in :mod:`fedcomm.data.text`.
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from fedcomm.data import text
from fedcomm.data.types import Dataset
from fedcomm.errors import InputError

DATA_ROOT_ENV = "FEDCOMM_DATA_ROOT"
Loader = Callable[[Path | None, Mapping[str, Any]], Dataset]
DATASETS: dict[str, Loader] = {}


class DatasetNotFoundError(InputError, FileNotFoundError):
    """A dataset's files are not under the data root; the message says what to put where."""


def resolve_root(root: str | Path | None) -> Path | None:
    """The data root: explicit ``root`` wins, else ``$FEDCOMM_DATA_ROOT``, else ``None``.

    Args:
        root: an explicit data root (``data.root`` of ``params.yaml``); ``None`` or ``""`` defer
            to the environment variable.

    Returns:
        The root with ``~`` expanded, or ``None`` when neither is set.
    """
    if root is not None and str(root) != "":
        return Path(root).expanduser()
    env = os.environ.get(DATA_ROOT_ENV, "")
    return Path(env).expanduser() if env else None


def register(name: str) -> Callable[[Loader], Loader]:
    """Decorator adding a loader to :data:`DATASETS` under ``name``.

    Args:
        name: registry name; registering a name twice raises ``ValueError``.

    Returns:
        A decorator that registers and returns the loader unchanged.
    """

    def deco(fn: Loader) -> Loader:
        if name in DATASETS:
            raise ValueError(f"dataset {name!r} is already registered")
        DATASETS[name] = fn
        return fn

    return deco


def load_dataset(name: str, root: str | Path | None = None, **options: Any) -> Dataset:
    """Load dataset ``name`` from ``root`` (see :func:`resolve_root`) with loader ``options``.

    Args:
        name: a key of :data:`DATASETS`.
        root: data root; ``None`` falls back to ``$FEDCOMM_DATA_ROOT``.
        **options: loader-specific options (see each loader's docstring).

    Returns:
        The pooled dataset (official train split first, then test).

    Raises:
        ValueError: unknown name, or a bad / unknown option.
        DatasetNotFoundError: the dataset's files are missing.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; registered: {', '.join(sorted(DATASETS))}")
    return DATASETS[name](resolve_root(root), options)


# --- errors and options ------------------------------------------------------------------------


def _not_found(
    name: str, root: Path | None, wanted: Sequence[str], note: str = ""
) -> DatasetNotFoundError:
    """A :class:`DatasetNotFoundError` listing ``wanted`` (paths relative to the root)."""
    if root is None:
        head = f"dataset {name!r} needs local files but no data root is set"
        files = "\n".join(f"  <data root>/{w}" for w in wanted)
    else:
        head = f"dataset {name!r} not found under data root {root}"
        files = "\n".join(f"  {root / w}" for w in wanted)
    tail = f"\nset data.root in params.yaml or {DATA_ROOT_ENV} to the folder holding them"
    return DatasetNotFoundError(f"{head}; expected:\n{files}{note}{tail}")


class _Options:
    """Typed access to a loader's options; rejects unknown names and ill-typed values."""

    def __init__(self, dataset: str, options: Mapping[str, Any], allowed: Sequence[str]) -> None:
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(f"dataset {dataset!r}: unknown options {unknown}; allowed {allowed}")
        self.dataset, self.options = dataset, options

    def _bad(self, key: str, want: str) -> ValueError:
        return ValueError(f"dataset {self.dataset!r}: option {key}={self.options[key]!r}: {want}")

    def flag(self, key: str, default: bool) -> bool:
        v = self.options.get(key, default)
        if not isinstance(v, bool | np.bool_):
            raise self._bad(key, "expected a bool")
        return bool(v)

    def integer(self, key: str, default: int, minimum: int) -> int:
        v = self.optional_integer(key, minimum, default)
        if v is None:
            raise self._bad(key, f"expected an integer >= {minimum}")
        return v

    def optional_integer(self, key: str, minimum: int, default: int | None = None) -> int | None:
        v = self.options.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < minimum:
            raise self._bad(key, f"expected an integer >= {minimum}")
        return int(v)

    def number(self, key: str, default: float, minimum: float) -> float:
        v = self.options.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float | np.number) or not v >= minimum:
            raise self._bad(key, f"expected a number >= {minimum}")
        return float(v)

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        v = self.options.get(key, default)
        if v not in choices:
            raise self._bad(key, f"expected one of {list(choices)}")
        return str(v)


def _open(path: Path) -> Any:
    """Open ``path`` for binary reading, transparently gunzipping ``*.gz``."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


# --- bundled / generated -----------------------------------------------------------------------


@register("digits")
def _load_digits(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """scikit-learn's 1,797 8x8 digits: x ``(n, 1, 8, 8)`` in [0, 1], 10 classes."""
    from sklearn.datasets import load_digits

    _Options("digits", options, ())
    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / 16.0)[:, None]  # (n, 1, 8, 8)
    return Dataset("digits", x, np.asarray(bunch.target, dtype=np.int64), num_classes=10)


_SYNTHETIC_OPTIONS = ("alpha", "beta", "num_users", "dim", "num_classes", "iid", "seed")


@register("synthetic")
def _load_synthetic(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """Synthetic(alpha, beta) of FedProx (Li et al., 2020), one natural client per user.

    Per user k: ``u_k ~ N(0, alpha)``, ``B_k ~ N(0, beta)``, ``W_k ~ N(u_k, 1)`` ``(dim, C)``,
    ``b_k ~ N(u_k, 1)`` ``(C,)``, ``v_k ~ N(B_k, 1)`` ``(dim,)``; ``x ~ N(v_k, Sigma)`` with
    ``Sigma_jj = j^-1.2``; ``y = argmax(x W_k + b_k)``; ``n_k = lognormal(4, 2) + min_samples``.
    ``iid``: one shared ``W, b ~ N(0, 1)`` and ``v_k = B_k`` in every coordinate (reference).
    """
    o = _Options("synthetic", options, (*_SYNTHETIC_OPTIONS, "min_samples"))
    alpha, beta = o.number("alpha", 0.0, 0.0), o.number("beta", 0.0, 0.0)
    users, dim = o.integer("num_users", 30, 1), o.integer("dim", 60, 1)
    classes, seed = o.integer("num_classes", 10, 2), o.integer("seed", 0, 0)
    min_samples, iid = o.integer("min_samples", 50, 0), o.flag("iid", False)

    rng = np.random.default_rng(seed)
    sizes = rng.lognormal(4, 2, users).astype(np.int64) + min_samples  # (users,)
    mean_w = rng.normal(0, alpha, users)  # u_k, also the mean of b_k
    big_b = rng.normal(0, beta, users)  # B_k
    if iid:
        mean_x = np.repeat(big_b[:, None], dim, axis=1)  # (users, dim)
        w_shared, b_shared = rng.normal(0, 1, (dim, classes)), rng.normal(0, 1, classes)
    else:
        mean_x = rng.normal(big_b[:, None], 1, (users, dim))  # (users, dim)
    std = np.arange(1, dim + 1, dtype=np.float64) ** -0.6  # sqrt(Sigma_jj) = (j^-1.2)^0.5
    xs, ys = [], []
    for k in range(users):
        w = w_shared if iid else rng.normal(mean_w[k], 1, (dim, classes))
        b = b_shared if iid else rng.normal(mean_w[k], 1, classes)
        xk = mean_x[k] + rng.standard_normal((int(sizes[k]), dim)) * std  # (n_k, dim)
        xs.append(xk.astype(np.float32))
        ys.append(np.argmax(xk @ w + b, axis=1).astype(np.int64))  # softmax is monotone
    nid = np.repeat(np.arange(users, dtype=np.int64), sizes)
    names = tuple(f"user_{k}" for k in range(users))
    return Dataset(
        "synthetic", np.concatenate(xs), np.concatenate(ys), classes, "classification", nid, names
    )


# --- IDX (MNIST, Fashion-MNIST) ---------------------------------------------------------------

_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (``.gz`` or plain): magic ``00 00 <dtype> <ndim>``, big-endian dims.

    Args:
        path: the file; a ``.gz`` suffix means gzip-compressed.

    Returns:
        A read-only array of the header's shape and (big-endian) element type.

    Raises:
        ValueError: bad magic, unknown type code, or a size that does not match the header.
    """
    path = Path(path)
    with _open(path) as f:
        buf: bytes = f.read()
    if len(buf) < 4 or buf[0] != 0 or buf[1] != 0 or buf[2] not in _IDX_DTYPES:
        raise ValueError(f"{path}: not an IDX file (magic {buf[:4].hex()})")
    ndim = buf[3]
    dims = tuple(int(d) for d in np.frombuffer(buf, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[buf[2]])
    offset = 4 + 4 * ndim
    if len(buf) - offset != int(np.prod(dims)) * dtype.itemsize:
        raise ValueError(f"{path}: header says {dims} {dtype}, payload has {len(buf) - offset} B")
    return np.frombuffer(buf, dtype, offset=offset).reshape(dims)


def _find_files(root: Path, subdirs: Sequence[str], names: Sequence[str]) -> list[Path] | None:
    """The first ``root/subdir`` holding every name (``name.gz`` or ``name``), else ``None``."""
    for sub in subdirs:
        found = [
            next((p for p in (root / sub / f"{n}.gz", root / sub / n) if p.is_file()), None)
            for n in names
        ]
        if all(p is not None for p in found):
            return [p for p in found if p is not None]
    return None


def _load_idx_dataset(
    name: str, subdirs: Sequence[str], root: Path | None, options: Mapping[str, Any]
) -> Dataset:
    """MNIST-format loader: x ``(70000, 1, 28, 28)`` float32 in [0, 1], 10 classes."""
    normalize = _Options(name, options, ("normalize",)).flag("normalize", False)
    files = _find_files(root, subdirs, _IDX_FILES) if root is not None else None
    if root is None or files is None:
        alt = ", ".join(str(root / s) if root else f"<data root>/{s}" for s in subdirs[1:])
        note = f"\n(also accepted in {alt}; with or without .gz)"
        raise _not_found(name, root, [f"{subdirs[0]}/{n}.gz" for n in _IDX_FILES], note)
    tr_x, tr_y, te_x, te_y = (read_idx(p) for p in files)
    for imgs, labels, split in ((tr_x, tr_y, "train"), (te_x, te_y, "test")):
        if imgs.ndim != 3 or imgs.shape[1:] != (28, 28) or labels.shape != (len(imgs),):
            raise ValueError(f"{name} {split}: images {imgs.shape} / labels {labels.shape}")
        if labels.size and not 0 <= labels.min() <= labels.max() <= 9:
            raise ValueError(f"{name} {split}: labels outside 0..9")
    x = np.concatenate([tr_x, te_x]).astype(np.float32)[:, None]  # (n, 1, 28, 28)
    x /= 255.0  # in place: no second full-size copy
    if normalize:
        x = (x - x.mean()) / x.std()
    y = np.concatenate([tr_y, te_y]).astype(np.int64)
    return Dataset(name, x, y, num_classes=10)


@register("mnist")
def _load_mnist(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """MNIST from the four IDX files (``mnist/``, ``MNIST/raw/`` or the root itself)."""
    return _load_idx_dataset("mnist", ("mnist", "MNIST/raw", "."), root, options)


@register("fashion_mnist")
def _load_fashion_mnist(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """Fashion-MNIST from the four IDX files (``fashion_mnist/`` or ``FashionMNIST/raw/``)."""
    return _load_idx_dataset("fashion_mnist", ("fashion_mnist", "FashionMNIST/raw"), root, options)


# --- LEAF JSON (FEMNIST, Shakespeare) ----------------------------------------------------------


def _leaf_files(folder: Path) -> list[Path]:
    """Sorted ``*.json`` / ``*.json.gz`` files of a LEAF split folder."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))


def _find_leaf(root: Path | None, bases: Sequence[str]) -> tuple[list[Path], list[Path]] | None:
    """Train and test LEAF files under the first base folder that has any."""
    if root is None:
        return None
    for base in bases:
        train, test = _leaf_files(root / base / "train"), _leaf_files(root / base / "test")
        if train or test:
            return train, test
    return None


def _iter_leaf_users(files: Sequence[Path]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Yield ``(user id, user_data record)`` in file order, then ``users`` order."""
    for path in files:
        with _open(path) as f:
            blob = json.load(f)
        if not isinstance(blob, dict) or not {"users", "user_data"} <= blob.keys():
            raise ValueError(f"{path}: not LEAF JSON (needs 'users' and 'user_data')")
        for uid in blob["users"]:
            yield str(uid), blob["user_data"][uid]


@register("femnist")
def _load_femnist(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """FEMNIST (LEAF): x ``(n, 1, 28, 28)`` float32, 62 classes, one natural client per writer.

    LEAF stores white background (1.0); ``invert=True`` returns ``1 - x`` (background 0, as MNIST).
    """
    invert = _Options("femnist", options, ("invert",)).flag("invert", False)
    found = _find_leaf(root, ("leaf/femnist", "femnist"))
    if found is None:
        wanted = [f"leaf/femnist/{s}/<LEAF shard>.json.gz" for s in ("train", "test")]
        raise _not_found("femnist", root, wanted, "\n(also accepted: femnist/{train,test}/*.json)")
    writers: dict[str, int] = {}
    xs, ys, ids = [], [], []
    for uid, rec in _iter_leaf_users([*found[0], *found[1]]):
        x = np.asarray(rec["x"], dtype=np.float32)  # (n_u, 784)
        y = np.asarray(rec["y"], dtype=np.int64)  # (n_u,)
        if x.ndim != 2 or x.shape[1] != 784 or y.shape != (len(x),):
            raise ValueError(f"femnist user {uid!r}: x {x.shape}, y {y.shape}")
        xs.append(x.reshape(-1, 1, 28, 28))
        ys.append(y)
        ids.append(np.full(len(y), writers.setdefault(uid, len(writers)), dtype=np.int64))
    x_all, y_all = np.concatenate(xs), np.concatenate(ys)
    if y_all.size and not 0 <= y_all.min() <= y_all.max() <= 61:
        raise ValueError("femnist: labels outside 0..61")
    if invert:
        x_all = 1.0 - x_all
    return Dataset(
        "femnist", x_all, y_all, 62, "classification", np.concatenate(ids), tuple(writers)
    )


@register("shakespeare")
def _load_shakespeare(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """Shakespeare next-char (LEAF JSON, else roles JSONL) or next-word (roles JSONL).

    See :mod:`fedcomm.data.text` for windows, vocabularies and role selection.
    """
    o = _Options(
        "shakespeare",
        options,
        ("target", "seq_len", "stride", "max_roles", "min_samples", "vocab_size"),
    )
    target = o.choice("target", "next_char", ("next_char", "next_word"))
    seq_len, stride = o.optional_integer("seq_len", 1), o.optional_integer("stride", 1)
    max_roles, min_samples = o.optional_integer("max_roles", 1), o.integer("min_samples", 2, 0)
    vocab_size = o.integer("vocab_size", 10000, 3)
    leaf = _find_leaf(root, ("shakespeare",)) if target == "next_char" else None
    if leaf is not None:
        if stride is not None:
            raise ValueError("shakespeare: option stride does not apply to LEAF JSON windows")
        users = _iter_leaf_users([*leaf[0], *leaf[1]])
        return text.shakespeare_from_leaf(
            users, seq_len=seq_len, min_samples=min_samples, max_roles=max_roles
        )
    roles = root / "shakespeare" / "roles.jsonl.gz" if root is not None else None
    if roles is None or not roles.is_file():
        note = "\n(or, for next_char, LEAF JSON in shakespeare/{train,test}/*.json)"
        raise _not_found("shakespeare", root, ["shakespeare/roles.jsonl.gz"], note)
    seq_len = seq_len or (80 if target == "next_char" else 20)
    return text.shakespeare_from_roles(
        text.read_roles(roles),
        target=cast(text.ShakespeareTarget, target),
        seq_len=seq_len,
        stride=stride or seq_len,
        min_samples=min_samples,
        max_roles=max_roles,
        vocab_size=vocab_size,
    )


@register("ptb")
def _load_ptb(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """Penn Treebank (Mikolov): next-word windows from whichever of train/valid/test exist."""
    seq_len = _Options("ptb", options, ("seq_len",)).integer("seq_len", 35, 1)
    names = [f"ptb.{split}.txt" for split in ("train", "valid", "test")]
    for folder in (root / "ptb", root) if root is not None else ():
        paths = [folder / n for n in names if (folder / n).is_file()]
        if paths:
            return text.ptb_from_streams([text.read_ptb_tokens(p) for p in paths], seq_len=seq_len)
    raise _not_found("ptb", root, [f"ptb/{n}" for n in names], "\n(any of them; also in the root)")


# --- CIFAR (python pickles) --------------------------------------------------------------------


def _read_cifar_batch(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR pickle: x ``(n, 3, 32, 32)`` uint8, y ``(n,)`` int64."""
    with open(path, "rb") as f:
        batch = pickle.load(f, encoding="bytes")
    data = np.asarray(batch[b"data"], dtype=np.uint8)
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (len(data),):
        raise ValueError(f"{path}: data {data.shape}, labels {labels.shape}")
    return data.reshape(-1, 3, 32, 32), labels


def _load_cifar(
    name: str, folder: str, files: Sequence[str], label_key: bytes, classes: int, root: Path | None
) -> Dataset:
    """Pool CIFAR pickles: x ``(n, 3, 32, 32)`` float32 in [0, 1]."""
    paths = [root / folder / f for f in files] if root is not None else []
    if root is None or not all(p.is_file() for p in paths):
        raise _not_found(name, root, [f"{folder}/{f}" for f in files])
    parts = [_read_cifar_batch(p, label_key) for p in paths]
    x = np.concatenate([p[0] for p in parts]).astype(np.float32)
    x /= 255.0
    y = np.concatenate([p[1] for p in parts])
    if y.size and not 0 <= y.min() <= y.max() < classes:
        raise ValueError(f"{name}: labels outside 0..{classes - 1}")
    return Dataset(name, x, y, num_classes=classes)


@register("cifar10")
def _load_cifar10(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """CIFAR-10 from ``cifar-10-batches-py/`` (``data_batch_1..5``, ``test_batch``)."""
    _Options("cifar10", options, ())
    files = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]
    return _load_cifar("cifar10", "cifar-10-batches-py", files, b"labels", 10, root)


@register("cifar100")
def _load_cifar100(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """CIFAR-100 from ``cifar-100-python/`` (``train``, ``test``); ``label`` fine or coarse."""
    label = _Options("cifar100", options, ("label",)).choice("label", "fine", ("fine", "coarse"))
    key, classes = (b"fine_labels", 100) if label == "fine" else (b"coarse_labels", 20)
    return _load_cifar("cifar100", "cifar-100-python", ("train", "test"), key, classes, root)
