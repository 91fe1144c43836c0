"""The decode cache of ImageFolder datasets (:mod:`.image_folder`): the decoded ``uint8`` pixels
stored once per content.

Decoding is the slow part (60,000 CIFAR-10 JPEGs: tens of seconds on 2 cores), so the decoded
``uint8`` array is written once to ``<cache dir>/image_folder/<key>.npz`` (the cache dir is
``$FEDCOMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedcomm``, else ``~/.cache/fedcomm``; never the
data root, which may be read-only). The key is the sha256 of: every image's path relative to
the dataset folder, its size and its bytes (all read on every load: about a second for CIFAR-10),
the mode, and the decoder (Pillow's and libjpeg's versions, since JPEG decoders may differ by a
grey level). So any change of a file's bytes, name or class, or of the decoder, decodes afresh;
the folder may move. The file is written atomically (``fedcomm.atomic``) under a lock (parallel
workers decode once) and holds the sha256 of its arrays: a cache file that cannot be read or
whose content does not match is reported (a ``warning:`` line) and rebuilt, never used. An
unwritable cache dir is a warning, not an error; ``cache: false`` decodes every time.
"""

from __future__ import annotations

import hashlib
import json
import warnings
import zipfile
from pathlib import Path

import numpy as np

from fedcomm.atomic import atomic_path, file_lock
from fedcomm.data.datasets.image_files import (
    IMAGE_RELEASE,
    MODES,
    Listing,
    decode,
    decoder_id,
    describe_size,
)
from fedcomm.data.datasets.verify import damaged
from fedcomm.errors import InputWarning, one_line
from fedcomm.paths import CACHE_ENV, cache_root

_FORMAT = 1  # version of the cache file's layout; part of the key


class CacheWarning(InputWarning):
    """The decode cache could not be used or written; the data is decoded from the images."""


def _array_digest(x: np.ndarray, y: np.ndarray) -> str:
    h = hashlib.sha256()
    for a in (x, y):
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


def cache_key(files_sha256: str, layout_sha256: str, mode: str) -> str:
    blob = json.dumps([_FORMAT, files_sha256, layout_sha256, mode, decoder_id()])
    return hashlib.sha256(blob.encode()).hexdigest()


def _warn(message: str) -> None:
    warnings.warn(CacheWarning(message), stacklevel=3)


def read_cache(path: Path, listing: Listing, mode: str) -> np.ndarray | None:
    """The cached ``(n, C, H, W)`` array, or ``None`` (absent; damaged: warned, removed)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            x, y, digest = z["x"], z["y"], str(z["digest"])
            classes = tuple(str(c) for c in z["classes"])
        problem = ""
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:2] != (len(listing.files), MODES[mode]):
            problem = f"holds {x.dtype} {x.shape}, not {len(listing.files)} {mode} images"
        elif classes != listing.classes or not np.array_equal(y, listing.labels):
            problem = "its classes or labels differ from the folder's"
        elif _array_digest(x, y) != digest:
            problem = "its content does not match its sha256 (corrupted)"
    except (
        OSError,
        ValueError,
        KeyError,
        EOFError,
        zipfile.BadZipFile,
    ) as err:  # zip or npy damage
        problem = f"cannot be read ({one_line(err)})"
    if not problem:
        return x
    _warn(f"{path}: decode cache {problem}; ignoring it and decoding the images again")
    path.unlink(missing_ok=True)
    return None


def write_cache(path: Path, x: np.ndarray, listing: Listing) -> None:
    """Write the decoded images atomically; an unwritable cache dir is only a warning."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            np.savez(
                f,
                x=x,
                y=listing.labels,
                classes=np.array(listing.classes),
                digest=np.array(_array_digest(x, listing.labels)),
            )
    except OSError as err:
        _warn(
            f"{path}: cannot write the decode cache ({one_line(err)}); the images will be "
            f"decoded again next time: set {CACHE_ENV} to a writable folder"
        )


def load_pixels(
    listing: Listing, key: str, mode: str, size: tuple[int, int] | None, cache: bool
) -> np.ndarray:
    """The decoded images, from the cache when it holds them (else decoded, then cached)."""
    if not cache:
        return decode(listing, mode, size)
    path = cache_root() / "image_folder" / f"{key}.npz"
    lock = path.parent / ".lock"  # one for the folder: a failed load leaves no file of its own
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.touch()
    except OSError as err:
        _warn(
            f"{path.parent}: cannot use the decode cache ({one_line(err)}); decoding the "
            f"images: set {CACHE_ENV} to a writable folder"
        )
        return decode(listing, mode, size)
    with file_lock(lock):  # one process decodes, the others wait and read its file
        x = read_cache(path, listing, mode)
        if x is None:
            x = decode(listing, mode, size)
            write_cache(path, x, listing)
    hw = (x.shape[2], x.shape[3])
    if size is not None and hw != size:  # cached at the images' size, another one asked
        problem = f"image of {describe_size(hw)}, but the dataset's images are " + (
            f"{describe_size(size)} (data.dataset.size; images are not resized)"
        )
        raise damaged(listing.path(listing.files[0]), problem, IMAGE_RELEASE)
    return x
