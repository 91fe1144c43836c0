"""The CIFAR family: ``cifar10`` and ``cifar100`` from the python pickles.

Batches are checked for keys, shapes and label range; option ``verify`` (default ``true``)
compares a batch with the standard row count with torchvision's MD5 digests. The pickles are
trusted local files (``pickle.loads``).
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedcomm.data.datasets.options import ChannelStats, Options, standardize
from fedcomm.data.datasets.registry import register
from fedcomm.data.datasets.verify import check_md5, not_found, reading
from fedcomm.data.types import Dataset

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
    normalize: ChannelStats | None = None,
) -> Dataset:
    """Pool CIFAR pickles: x ``(n, 3, 32, 32)`` float32 in [0, 1] (``normalize``: standardized
    per channel, see :func:`~fedcomm.data.datasets.options.standardize`)."""
    paths = [root / folder / f for f in files] if root is not None else []
    if root is None or not all(p.is_file() for p in paths):
        raise not_found(name, root, [f"{folder}/{f}" for f in files])
    release = f"the standard {'CIFAR-10' if name == 'cifar10' else 'CIFAR-100'} python batch"
    parts = [_read_cifar_batch(p, label_key, classes, release, verify) for p in paths]
    x = np.concatenate([p[0] for p in parts]).astype(np.float32)
    x /= 255.0
    standardize(x, normalize, name)
    y = np.concatenate([p[1] for p in parts])
    return Dataset(name, x, y, num_classes=classes)


@register("cifar10")
def _load_cifar10(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """CIFAR-10 from ``cifar-10-batches-py/`` (``data_batch_1..5``, ``test_batch``)."""
    o = Options("cifar10", options, ("verify", "normalize"))
    verify, stats = o.flag("verify", True), o.channel_stats("normalize")
    files = [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"]
    return _load_cifar("cifar10", "cifar-10-batches-py", files, b"labels", 10, root, verify, stats)


@register("cifar100")
def _load_cifar100(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """CIFAR-100 from ``cifar-100-python/`` (``train``, ``test``); ``label`` fine or coarse."""
    o = Options("cifar100", options, ("label", "verify", "normalize"))
    label, verify = o.choice("label", "fine", ("fine", "coarse")), o.flag("verify", True)
    stats = o.channel_stats("normalize")
    key, classes = (b"fine_labels", 100) if label == "fine" else (b"coarse_labels", 20)
    files = ("train", "test")
    return _load_cifar("cifar100", "cifar-100-python", files, key, classes, root, verify, stats)
