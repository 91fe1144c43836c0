"""The files of an ImageFolder dataset (:mod:`.image_folder`): listing, content digests, decoding.

Layout, under the data root: ``<path>/train/<class>/<image>`` and ``<path>/test/<class>/<image>``
(images may sit in sub-folders of a class folder). Classes are the sorted names of ``train/``'s
class folders, label = index in that order (as ``torchvision.datasets.ImageFolder``); both
splits must hold the same classes. Images are the files with an image suffix (``.jpg``,
``.jpeg``, ``.png``, ``.bmp``, ``.ppm``, ``.pgm``, ``.tif``, ``.tiff``, ``.webp``, any case);
hidden entries (``.name``) and other files are ignored, as ``ImageFolder`` does. The pooled
dataset is train then test, each split class by class in label order, files in sorted path
order.

Every image must have the dataset's ``mode`` (``RGB``, ``L`` or ``RGBA``; no silent conversion)
and size (``size`` = ``(height, width)``, else the first train image's). A missing split, a
class folder without images or in one split only, an unreadable, corrupted or truncated image
(Pillow's decoder raises on a cut or broken JPEG stream), or an image of another size or mode is
a :class:`DatasetFileError` / :class:`DatasetNotFoundError` whose one line names the file.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedcomm.data.datasets.verify import DatasetFileError, DatasetNotFoundError, damaged, reading
from fedcomm.data.datasets.verify import problem as describe_error
from fedcomm.errors import one_line

SPLITS = ("train", "test")
MODES = {"L": 1, "RGB": 3, "RGBA": 4}  # Pillow mode -> channels
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".ppm", ".pgm", ".tif", ".tiff", ".webp")
IMAGE_RELEASE = "the image, or remove it"  # the remedy for a damaged image


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
        raise damaged(
            listing.path(rel), describe_error(err, listing.path(rel)), IMAGE_RELEASE
        ) from err
    if not raw:
        raise damaged(listing.path(rel), "the file is empty", IMAGE_RELEASE)
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


def describe_size(hw: tuple[int, int]) -> str:
    return f"{hw[0]}x{hw[1]} (height x width)"


def _decode_one(
    path: Path, mode: str, hw: tuple[int, int] | None, first: Path | None
) -> np.ndarray:
    """One image as ``(H, W, C)`` uint8, checked for mode and size."""
    from PIL import Image, UnidentifiedImageError

    with reading(path, IMAGE_RELEASE):
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
                    IMAGE_RELEASE,
                )
            size = (im.height, im.width)
            if hw is not None and size != hw:
                source = f"the first image, {first}" if first else "data.dataset.size"
                raise damaged(
                    path,
                    f"image of {describe_size(size)}, but the dataset's images are "
                    f"{describe_size(hw)} ({source}; images are not resized)",
                    IMAGE_RELEASE,
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
