"""Tiny datasets in torchvision's ImageFolder layout, for tests that need images on disk.

``write_image_folder(tmp_path / "data_root" / "imgs")`` writes ``train/<class>/NNNN.jpg`` and
``test/<class>/NNNN.jpg`` of seeded random pixels; load it with
``data.dataset: {name: image_folder, path: imgs}`` and ``data.root`` (or ``$FEDCOMM_DATA_ROOT``)
at ``tmp_path / "data_root"``. Set ``$FEDCOMM_CACHE_DIR`` to a temporary folder in such tests so
the decode cache stays out of the user's ``~/.cache``.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from PIL import Image

SUFFIX = {"JPEG": ".jpg", "PNG": ".png", "BMP": ".bmp"}


def image_pixels(
    seed: int, index: int, size: tuple[int, int] = (32, 32), channels: int = 3
) -> np.ndarray:
    """The ``(H, W, C)`` uint8 pixels of image ``index`` (seeded; ``C = 1`` gives ``(H, W)``)."""
    rng = np.random.default_rng([seed, index])
    shape = (*size, channels) if channels > 1 else size
    return rng.integers(0, 256, shape, dtype=np.uint8)


def write_image(path: Path, pixels: np.ndarray, fmt: str = "JPEG", quality: int = 75) -> Path:
    """Write ``pixels`` (``(H, W, 3)``, ``(H, W, 4)`` or ``(H, W)`` uint8) as one image file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.fromarray(pixels)
    img.save(path, fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return path


def write_image_folder(
    folder: Path,
    *,
    classes: Sequence[str] = ("cat", "dog", "frog"),
    per_class: tuple[int, int] = (4, 2),
    size: tuple[int, int] = (32, 32),
    mode: str = "RGB",
    fmt: str = "JPEG",
    seed: int = 0,
) -> Path:
    """Write an ImageFolder dataset at ``folder``: ``per_class`` = (train, test) images per class
    of ``size`` (height, width) and Pillow ``mode`` (``RGB``, ``L`` or ``RGBA``), numbered from
    0000 in each class folder, pixels :func:`image_pixels` (index counts over the whole folder,
    train first). ``fmt``: ``JPEG`` (quality 75, lossy, as the CIFAR-10 copy), ``PNG`` or ``BMP``
    (lossless: decoded pixels equal :func:`image_pixels`). Returns ``folder``."""
    channels = {"L": 1, "RGB": 3, "RGBA": 4}[mode]
    index = 0
    for split, count in zip(("train", "test"), per_class, strict=True):
        for name in classes:
            for k in range(count):
                pixels = image_pixels(seed, index, size, channels)
                write_image(folder / split / name / f"{k:04d}{SUFFIX[fmt]}", pixels, fmt)
                index += 1
    return folder


# --- bad input ---------------------------------------------------------------------------------


def _truncated_jpeg(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])


def _broken_jpeg(path: Path) -> None:  # the entropy-coded data overwritten: the decoder fails
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 40] = b"\xff" * 40
    path.write_bytes(bytes(data))


#: Bad input for a folder written by :func:`write_image_folder` with its defaults: name ->
#: (damage(folder), what the one-line error says after the folder's path).
DAMAGES: dict[str, tuple[Callable[[Path], object], str]] = {
    "missing-split": (lambda f: shutil.rmtree(f / "test"), "test: split folder missing"),
    "no-classes": (
        lambda f: [shutil.rmtree(d) for d in (f / "train").iterdir()],
        "train: no class folders",
    ),
    "empty-class": (
        lambda f: [p.unlink() for p in (f / "test" / "dog").iterdir()],
        "test/dog: empty class folder",
    ),
    "class-only-in-train": (
        lambda f: shutil.rmtree(f / "test" / "frog"),
        "test/frog: missing; class folder 'frog' is in train/ but not in test/",
    ),
    "class-only-in-test": (
        lambda f: shutil.copytree(f / "test" / "frog", f / "test" / "newt"),
        "train/newt: missing; class folder 'newt' is in test/ but not in train/",
    ),
    "empty-image": (
        lambda f: (f / "train" / "dog" / "0002.jpg").write_bytes(b""),
        "train/dog/0002.jpg: the file is empty",
    ),
    "not-an-image": (
        lambda f: (f / "train" / "dog" / "0002.jpg").write_text("<html>404</html>"),
        "train/dog/0002.jpg: not an image Pillow can identify",
    ),
    "truncated-jpeg": (
        lambda f: _truncated_jpeg(f / "test" / "cat" / "0001.jpg"),
        "test/cat/0001.jpg: corrupted or truncated image",
    ),
    "corrupted-jpeg": (
        lambda f: _broken_jpeg(f / "train" / "frog" / "0003.jpg"),
        "train/frog/0003.jpg: corrupted or truncated image",
    ),
    "other-size": (
        lambda f: write_image(f / "test" / "dog" / "0001.jpg", image_pixels(0, 0, (28, 32))),
        "test/dog/0001.jpg: image of 28x32 (height x width), but the dataset's images are 32x32",
    ),
    "other-mode": (
        lambda f: write_image(f / "train" / "cat" / "0003.jpg", image_pixels(0, 0, channels=1)),
        "train/cat/0003.jpg: image mode 'L', but the dataset's images are 'RGB'",
    ),
}
