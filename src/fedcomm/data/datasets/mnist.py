"""The IDX family: ``mnist`` and ``fashion_mnist`` (four IDX files each, ``.gz`` or plain).

IDX headers are checked against their payload, images against labels (count, shape, ``uint8``,
labels in range). Option ``verify`` (default ``true``) compares an MNIST file of the standard
size with LeCun's release (MD5 of its uncompressed content, checked against the shared data
root); Fashion-MNIST is not compared (no verified digests of its uncompressed files).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedcomm.data.datasets.options import Options
from fedcomm.data.datasets.registry import register
from fedcomm.data.datasets.verify import check_md5, damaged, not_found, open_data, reading
from fedcomm.data.types import Dataset

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
