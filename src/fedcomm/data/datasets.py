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
``image_folder``          ``<path>/{train,test}/<class>/<image>`` (torchvision's ImageFolder;
                          decoded once, cached by content: :mod:`fedcomm.data.image_folder`)
``synthetic``             none (FedProx Synthetic(alpha, beta))
========================  ===================================================================

Damaged files: a dataset file that is present but empty, truncated, corrupted or of another
format or version raises :class:`DatasetFileError`, whose one-line message names the file, what is
wrong and the remedy (a fresh copy; see ``docs/configuration.md``). Each format is read in one
place (:func:`reading` turns any reader or parser failure into that error) and checked for damage
that parses: IDX headers against their payload, images against labels (count, shape, ``uint8``,
labels in range), LEAF records (``users`` / ``user_data``, per-user ``x`` and ``y``), roles records
(string ``play``, ``role``, ``text``), PTB text (UTF-8, no control characters, ends with a newline
as every standard file does) and CIFAR batches (keys, shapes, label range); gzip's CRC catches
corruption of ``.gz`` files. Option ``verify`` (default ``true``; ``mnist``, ``fashion_mnist``,
``ptb``, ``cifar10``, ``cifar100``) also compares a file of a standard release's size with that
release: the MD5 digest of MNIST's uncompressed IDX content (LeCun's files; checked against the
shared data root), of ``ptb.train.txt`` / ``ptb.valid.txt`` / ``ptb.test.txt`` (torchtext's
digests), of a CIFAR batch with the standard row count (torchvision's digests), of a CIFAR-10
ImageFolder copy (:mod:`fedcomm.data.image_folder`); and PTB text must use the standard alphabet
(lower-case ASCII, ``N`` for numbers, punctuation). ``verify: false`` accepts a user's own copy.
Not compared: Fashion-MNIST (no verified digests of its uncompressed files).

Choices: unknown option names raise ``ValueError`` (catches typos); ``shakespeare`` with
``target="next_word"`` always reads ``roles.jsonl.gz`` (LEAF JSON holds next-char windows only);
FEMNIST writers are numbered by first appearance over the sorted train files, then the test files;
``synthetic`` draws x from the diagonal Gaussian directly (same law as the reference's
``multivariate_normal``) with :func:`numpy.random.default_rng`, so values differ from the
reference script for the same seed. CIFAR pickles are trusted local files (``pickle.loads``).
Text-specific choices are documented in :mod:`fedcomm.data.text`.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, cast

import numpy as np

from fedcomm.data import image_folder, text
from fedcomm.data._loading import (
    DATA_ROOT_ENV,
    DatasetFileError,
    DatasetNotFoundError,
    Options,
    check_md5,
    damaged,
    not_found,
    open_data,
    reading,
)
from fedcomm.data._registry import add_entry
from fedcomm.data.types import Dataset

__all__ = [
    "DATASETS",
    "DATA_ROOT_ENV",
    "DatasetFileError",
    "DatasetNotFoundError",
    "Loader",
    "load_dataset",
    "read_idx",
    "register",
    "resolve_root",
]

Loader = Callable[[Path | None, Mapping[str, Any]], Dataset]
DATASETS: dict[str, Loader] = {}
_T = TypeVar("_T")


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
        add_entry(DATASETS, "dataset", name, fn)
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
        DatasetFileError: a dataset file is empty, truncated, corrupted or of another format.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; registered: {', '.join(sorted(DATASETS))}")
    return DATASETS[name](resolve_root(root), options)


# --- bundled / generated -----------------------------------------------------------------------


@register("digits")
def _load_digits(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """scikit-learn's 1,797 8x8 digits: x ``(n, 1, 8, 8)`` in [0, 1], 10 classes."""
    from sklearn.datasets import load_digits

    Options("digits", options, ())
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
    o = Options("synthetic", options, (*_SYNTHETIC_OPTIONS, "min_samples"))
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


#: ``(size, md5)`` of the uncompressed standard files (LeCun's; checked against the shared data
#: root's copies): uncompressed content of that size must have that digest.
_IDX_MD5: dict[str, dict[str, tuple[int, str]]] = {
    "mnist": {
        "train-images-idx3-ubyte": (47040016, "6bbc9ace898e44ae57da46a324031adb"),
        "train-labels-idx1-ubyte": (60008, "a25bea736e30d166cdddb491f175f624"),
        "t10k-images-idx3-ubyte": (7840016, "2646ac647ad5339dbf082846283269ea"),
        "t10k-labels-idx1-ubyte": (10008, "27ae3e4e09519cfbb04c329615203637"),
    },
}


def read_idx(
    path: str | Path,
    *,
    release: str = "the original IDX file",
    standard: tuple[int, str] | None = None,
) -> np.ndarray:
    """Read an IDX file (``.gz`` or plain): magic ``00 00 <dtype> <ndim>``, big-endian dims.

    Args:
        path: the file; a ``.gz`` suffix means gzip-compressed.
        release: what a fresh copy of the file is, for the error's remedy.
        standard: ``(size, md5)`` of the standard file: uncompressed content of that size must
            have that MD5 digest.

    Returns:
        A read-only array of the header's shape and (big-endian) element type.

    Raises:
        DatasetFileError: (a ``ValueError``) empty, not gzip / IDX, bad magic, unknown type code,
            a size that does not match the header, or a standard size with another digest.
    """
    path = Path(path)
    with reading(path, release):
        with open_data(path) as f:
            buf: bytes = f.read()
        if not buf:
            raise ValueError("no data after gunzip")
        if len(buf) < 4 or buf[0] != 0 or buf[1] != 0 or buf[2] not in _IDX_DTYPES:
            hint = " (gzip data: its name must end in .gz)" if buf[:2] == b"\x1f\x8b" else ""
            raise ValueError(f"not an IDX file (magic {buf[:4].hex()}){hint}")
        ndim, offset = buf[3], 4 + 4 * buf[3]
        if len(buf) < offset:
            raise ValueError(f"truncated IDX header ({len(buf)} B for {ndim} dimensions)")
        dims = tuple(int(d) for d in np.frombuffer(buf, ">u4", count=ndim, offset=4))
        dtype = np.dtype(_IDX_DTYPES[buf[2]])
        want, have = int(np.prod(dims)) * dtype.itemsize, len(buf) - offset
        if have != want:
            what = "truncated" if have < want else "trailing data"
            raise ValueError(f"{what}: header says {dims} {dtype} ({want} B), payload has {have} B")
        if standard is not None and len(buf) == standard[0]:
            check_md5(path, buf, standard[1], release)
    return np.frombuffer(buf, dtype, offset=offset).reshape(dims)


def _describe(arr: np.ndarray) -> str:
    return f"an IDX array {arr.shape} {arr.dtype}"


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
    o = Options(name, options, ("normalize", "verify"))
    normalize, verify = o.flag("normalize", False), o.flag("verify", True)
    files = _find_files(root, subdirs, _IDX_FILES) if root is not None else None
    if root is None or files is None:
        alt = ", ".join(str(root / s) if root else f"<data root>/{s}" for s in subdirs[1:])
        note = f" (also accepted in {alt}; with or without .gz)"
        raise not_found(name, root, [f"{subdirs[0]}/{n}.gz" for n in _IDX_FILES], note)
    release = f"the standard {'MNIST' if name == 'mnist' else 'Fashion-MNIST'} file"
    digests = _IDX_MD5.get(name, {}) if verify else {}
    tr_x, tr_y, te_x, te_y = (
        read_idx(p, release=release, standard=digests.get(n))
        for p, n in zip(files, _IDX_FILES, strict=True)
    )
    for imgs, labels, i in ((tr_x, tr_y, 0), (te_x, te_y, 2)):
        if imgs.dtype != np.uint8 or imgs.ndim != 3 or imgs.shape[1:] != (28, 28):
            problem = f"holds {_describe(imgs)}, not 28x28 uint8 images (another file there?)"
            raise damaged(files[i], problem, release)
        if labels.dtype != np.uint8 or labels.ndim != 1:
            problem = f"holds {_describe(labels)}, not uint8 labels (another file there?)"
            raise damaged(files[i + 1], problem, release)
        if len(labels) != len(imgs):
            problem = f"holds {len(labels)} labels for the {len(imgs)} images of {files[i].name}"
            raise damaged(files[i + 1], problem, release)
        if labels.size and labels.max() > 9:
            raise damaged(files[i + 1], f"labels outside 0..9 (up to {labels.max()})", release)
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


def _iter_leaf_users(
    files: Sequence[Path], release: str, convert: Callable[[str, Any], _T]
) -> Iterator[tuple[str, _T]]:
    """Yield ``(user id, convert(user id, user_data record))`` in file order, then ``users``
    order. Each file is read and all its records converted (``convert`` raises ``ValueError`` on
    a bad record) before its users are yielded, so a damaged file is named with ``release``."""
    for path in files:
        with reading(path, release):
            with open_data(path) as f:
                blob = json.load(f)
            if not isinstance(blob, dict) or not {"users", "user_data"} <= blob.keys():
                raise ValueError("not LEAF JSON (needs 'users' and 'user_data')")
            users, data = blob["users"], blob["user_data"]
            if not isinstance(users, list) or not isinstance(data, dict) or not users:
                raise ValueError("not LEAF JSON ('users' must be a non-empty list of user ids)")
            records = []
            for uid in users:
                if not isinstance(uid, str) or not isinstance(data.get(uid), dict):
                    raise ValueError(f"user {uid!r} in 'users' has no record in 'user_data'")
                records.append((uid, convert(uid, data[uid])))
        yield from records


def _femnist_user(uid: str, rec: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """One FEMNIST writer's x ``(n, 1, 28, 28)`` float32 and y ``(n,)`` int64."""
    try:
        x = np.asarray(rec["x"], dtype=np.float32)  # (n_u, 784)
        y = np.asarray(rec["y"], dtype=np.int64)  # (n_u,)
    except (KeyError, ValueError, TypeError) as err:
        raise ValueError(f"user {uid!r}: needs 'x' and 'y' lists of numbers ({err!r})") from err
    if x.ndim != 2 or x.shape[1] != 784 or y.shape != (len(x),):
        raise ValueError(f"user {uid!r}: x {x.shape}, y {y.shape}; expected (n, 784) and (n,)")
    if y.size and not 0 <= y.min() <= y.max() <= 61:
        raise ValueError(f"user {uid!r}: labels outside 0..61")
    return x.reshape(-1, 1, 28, 28), y


def _shakespeare_user(uid: str, rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """One LEAF Shakespeare role, checked: ``x`` equally long strings, ``y`` single characters."""
    xs, ys = rec.get("x"), rec.get("y")
    if not isinstance(xs, list) or not isinstance(ys, list) or len(xs) != len(ys):
        raise ValueError(f"user {uid!r}: needs 'x' and 'y' lists of the same length")
    if not all(isinstance(s, str) and len(s) == len(xs[0]) for s in xs) or not all(
        isinstance(c, str) and len(c) == 1 for c in ys
    ):
        raise ValueError(f"user {uid!r}: ragged x strings or y not single characters")
    return rec


@register("femnist")
def _load_femnist(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """FEMNIST (LEAF): x ``(n, 1, 28, 28)`` float32, 62 classes, one natural client per writer.

    LEAF stores white background (1.0); ``invert=True`` returns ``1 - x`` (background 0, as MNIST).
    """
    invert = Options("femnist", options, ("invert",)).flag("invert", False)
    found = _find_leaf(root, ("leaf/femnist", "femnist"))
    if found is None:
        wanted = [f"leaf/femnist/{s}/<LEAF shard>.json.gz" for s in ("train", "test")]
        raise not_found("femnist", root, wanted, " (also accepted: femnist/{train,test}/*.json)")
    writers: dict[str, int] = {}
    xs, ys, ids = [], [], []
    release = "the LEAF FEMNIST shard, or remove it"
    for uid, (x, y) in _iter_leaf_users([*found[0], *found[1]], release, _femnist_user):
        xs.append(x)
        ys.append(y)
        ids.append(np.full(len(y), writers.setdefault(uid, len(writers)), dtype=np.int64))
    x_all, y_all = np.concatenate(xs), np.concatenate(ys)
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
    o = Options(
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
        release = "the LEAF Shakespeare shard, or remove it"
        users = _iter_leaf_users([*leaf[0], *leaf[1]], release, _shakespeare_user)
        return text.shakespeare_from_leaf(
            users, seq_len=seq_len, min_samples=min_samples, max_roles=max_roles
        )
    roles = root / "shakespeare" / "roles.jsonl.gz" if root is not None else None
    if roles is None or not roles.is_file():
        note = " (or, for next_char, LEAF JSON in shakespeare/{train,test}/*.json)"
        raise not_found("shakespeare", root, ["shakespeare/roles.jsonl.gz"], note)
    seq_len = seq_len or (80 if target == "next_char" else 20)
    return text.shakespeare_from_roles(
        _read_roles(roles),
        target=cast(text.ShakespeareTarget, target),
        seq_len=seq_len,
        stride=stride or seq_len,
        min_samples=min_samples,
        max_roles=max_roles,
        vocab_size=vocab_size,
    )


def _read_roles(path: Path) -> list[tuple[str, str]]:
    """All ``("play/role", text)`` of a roles JSONL file, read to its end (so damage anywhere
    in it is found, whatever ``max_roles`` keeps)."""
    with reading(path, "the Shakespeare roles file"):
        roles = list(text.read_roles(path))
        if not roles:
            raise ValueError("holds no roles")
    return roles


# --- Penn Treebank -----------------------------------------------------------------------------

#: ``(size, md5)`` of Mikolov's files (torchtext's digests; sizes of the shared data root's copies).
_PTB_MD5 = {
    "ptb.train.txt": (5101618, "f26c4b92c5fdc7b3f8c7cdcb991d8420"),
    "ptb.valid.txt": (399782, "aa0affc06ff7c36e977d7cd49e3839bf"),
    "ptb.test.txt": (449945, "8b80168b89c18661a38ef683c0dc3721"),
}
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # tab, LF and CR are text
_NOT_PTB = re.compile(r"[^\n\r -@N\[-~]")  # outside lower-case printable ASCII, N and newlines


def _read_ptb(path: Path, verify: bool) -> list[str]:
    """Tokens of a Mikolov PTB file (:func:`text.ptb_tokens`), checked for damage.

    Always: UTF-8, no control characters, ends with a newline (a standard file does; a
    truncated one almost always ends mid-line). With ``verify``: the standard alphabet, and the
    standard digest for a file of the standard size.
    """
    release = "Mikolov's standard PTB file"
    with reading(path, release):
        data = path.read_bytes()
        content = data.decode("utf-8")
        bad = _CONTROL.search(content)
        if bad:
            line = content.count("\n", 0, bad.start()) + 1
            raise ValueError(f"control character {bad.group()!r} on line {line}: corrupted")
        if not content.endswith("\n"):
            raise ValueError("ends mid-line, without the final newline of a whole file: truncated")
        if verify:
            bad = _NOT_PTB.search(content)
            if bad:
                line = content.count("\n", 0, bad.start()) + 1
                problem = (
                    f"character {bad.group()!r} on line {line} is not in the word-level PTB text"
                    " (lower-case ASCII, N for numbers): another file or version in its place"
                )
                raise damaged(path, problem, release, own_copy=True)
            standard = _PTB_MD5.get(path.name)
            if standard is not None and len(data) == standard[0]:
                check_md5(path, data, standard[1], release)
    return text.ptb_tokens(content)


@register("ptb")
def _load_ptb(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """Penn Treebank (Mikolov): next-word windows from whichever of train/valid/test exist."""
    o = Options("ptb", options, ("seq_len", "verify"))
    seq_len, verify = o.integer("seq_len", 35, 1), o.flag("verify", True)
    names = [f"ptb.{split}.txt" for split in ("train", "valid", "test")]
    for folder in (root / "ptb", root) if root is not None else ():
        paths = [folder / n for n in names if (folder / n).is_file()]
        if paths:
            return text.ptb_from_streams([_read_ptb(p, verify) for p in paths], seq_len=seq_len)
    raise not_found("ptb", root, [f"ptb/{n}" for n in names], " (any of them; also in the root)")


# --- CIFAR (python pickles) --------------------------------------------------------------------


#: MD5 digests of the standard batches (torchvision's ``CIFAR10`` / ``CIFAR100`` lists), and the
#: rows of a standard batch: a batch of that many rows must have that digest.
_CIFAR_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f",
    "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751",
    "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb",
    "test_batch": "40351d587109b95175f43aff81a1287e",
    "train": "16019d7e3df5f24257cddd939b257f8d",  # cifar-100-python
    "test": "f0ef6b0ae62326f3e7ffdfab6717acfc",  # cifar-100-python
}
_CIFAR_ROWS = {"train": 50000}  # every other standard batch: 10000


def _read_cifar_batch(
    path: Path, label_key: bytes, classes: int, release: str, verify: bool
) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR pickle: x ``(n, 3, 32, 32)`` uint8, y ``(n,)`` int64."""
    with reading(path, release):
        raw = path.read_bytes()
        try:
            batch = pickle.loads(raw, encoding="bytes")
        except Exception as err:  # unpickling damaged bytes can raise almost anything
            kind = type(err).__name__
            raise ValueError(f"unreadable pickle, truncated or corrupted ({kind}: {err})") from err
        if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
            has = ", ".join(sorted(map(repr, batch))) if isinstance(batch, dict) else "no dict"
            raise ValueError(f"not a CIFAR batch with b'data' and {label_key!r} (has {has})")
        data = np.asarray(batch[b"data"], dtype=np.uint8)
        labels = np.asarray(batch[label_key], dtype=np.int64)
        if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or labels.shape != (len(data),):
            raise ValueError(f"data {data.shape}, labels {labels.shape}; expected (n, 3072), (n,)")
        if labels.size and not 0 <= labels.min() <= labels.max() < classes:
            raise ValueError(f"labels outside 0..{classes - 1} ({labels.min()}..{labels.max()})")
        if verify and len(data) == _CIFAR_ROWS.get(path.name, 10000) and path.name in _CIFAR_MD5:
            check_md5(path, raw, _CIFAR_MD5[path.name], release)
    return data.reshape(-1, 3, 32, 32), labels


def _load_cifar(
    name: str,
    folder: str,
    files: Sequence[str],
    label_key: bytes,
    classes: int,
    root: Path | None,
    verify: bool,
) -> Dataset:
    """Pool CIFAR pickles: x ``(n, 3, 32, 32)`` float32 in [0, 1]."""
    paths = [root / folder / f for f in files] if root is not None else []
    if root is None or not all(p.is_file() for p in paths):
        raise not_found(name, root, [f"{folder}/{f}" for f in files])
    release = f"the standard {'CIFAR-10' if name == 'cifar10' else 'CIFAR-100'} python batch"
    parts = [_read_cifar_batch(p, label_key, classes, release, verify) for p in paths]
    x = np.concatenate([p[0] for p in parts]).astype(np.float32)
    x /= 255.0
    y = np.concatenate([p[1] for p in parts])
    return Dataset(name, x, y, num_classes=classes)


@register("cifar10")
def _load_cifar10(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """CIFAR-10 from ``cifar-10-batches-py/`` (``data_batch_1..5``, ``test_batch``)."""
    verify = Options("cifar10", options, ("verify",)).flag("verify", True)
    files = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]
    return _load_cifar("cifar10", "cifar-10-batches-py", files, b"labels", 10, root, verify)


@register("cifar100")
def _load_cifar100(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """CIFAR-100 from ``cifar-100-python/`` (``train``, ``test``); ``label`` fine or coarse."""
    o = Options("cifar100", options, ("label", "verify"))
    label, verify = o.choice("label", "fine", ("fine", "coarse")), o.flag("verify", True)
    key, classes = (b"fine_labels", 100) if label == "fine" else (b"coarse_labels", 20)
    files = ("train", "test")
    return _load_cifar("cifar100", "cifar-100-python", files, key, classes, root, verify)


# --- ImageFolder (JPEG / PNG / ... files in class folders) ------------------------------------


@register("image_folder")
def _load_image_folder(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """Any dataset in torchvision's ``ImageFolder`` layout under ``root / path``, decoded once
    and cached by content (:mod:`fedcomm.data.image_folder`)."""
    o = Options("image_folder", options, ("path", "mode", "size", "verify", "cache"))
    return image_folder.load_image_folder(
        root,
        o.required_string("path", "cifar10_jpeg"),
        mode=o.choice("mode", "RGB", tuple(image_folder.MODES)),
        size=options.get("size"),
        verify=o.flag("verify", True),
        cache=o.flag("cache", True),
    )
