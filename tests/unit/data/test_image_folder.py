"""The ``image_folder`` dataset: torchvision's ImageFolder layout, decoded once, cached by content;
bad input named in one line. Tiny generated folders (``tests/image_folders.py``); the real
CIFAR-10 JPEG copy of ../shared/data in the ``slow`` test at the end."""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest

from fedcomm.data.datasets import image_cache, image_files, image_folder
from fedcomm.data.datasets.image_cache import CacheWarning
from fedcomm.data.datasets.image_folder import Release
from fedcomm.data.datasets.registry import load_dataset
from fedcomm.data.datasets.verify import DatasetFileError, DatasetNotFoundError
from fedcomm.data.types import Dataset
from fedcomm.paths import CACHE_ENV, cache_root
from tests.image_folders import DAMAGES, image_pixels, write_image, write_image_folder

SHARED = Path(__file__).resolve().parents[3].parent / "shared" / "data"
DOCS = "(see docs/configuration.md)"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty decode cache (``$FEDCOMM_CACHE_DIR``); returns the folder its files go to."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "image_folder"


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the folder decodes (one entry, the image count, per decode)."""
    calls: list[int] = []
    real = image_files.decode

    def spy(listing: image_files.Listing, *args: object, **kwargs: object) -> np.ndarray:
        calls.append(len(listing.files))
        return real(listing, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(image_cache, "decode", spy)
    return calls


def _load(root: Path, path: str = "imgs", **options: object) -> Dataset:
    return load_dataset("image_folder", root, path=path, **options)


def _cache_files(cache: Path) -> list[str]:
    return sorted(p.name for p in cache.glob("*.npz")) if cache.is_dir() else []


# --- the layout ---------------------------------------------------------------------------------


def test_layout_labels_order_and_pixels(tmp_path: Path, cache: Path) -> None:
    classes = ("zebra", "ant", "moth")  # written unsorted: labels follow the sorted names
    write_image_folder(tmp_path / "imgs", classes=classes, per_class=(3, 2), fmt="PNG", seed=4)
    ds = _load(tmp_path)
    assert ds.name == "image_folder:imgs" and ds.num_classes == 3 and ds.task == "classification"
    assert ds.x.shape == (15, 3, 32, 32) and ds.x.dtype == np.float32 and ds.y.dtype == np.int64
    # train then test; in each, classes in sorted order (ant 0, moth 1, zebra 2), files sorted
    assert ds.y.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 0, 1, 1, 2, 2]
    written = {  # (split, class) -> index of its first image in write order (zebra, ant, moth)
        ("train", "zebra"): 0, ("train", "ant"): 3, ("train", "moth"): 6,
        ("test", "zebra"): 9, ("test", "ant"): 11, ("test", "moth"): 13,
    }  # fmt: skip
    order = [
        (s, c, k) for s, n in (("train", 3), ("test", 2)) for c in sorted(classes) for k in range(n)
    ]
    for row, (split, name, k) in enumerate(order):
        want = image_pixels(4, written[split, name] + k).transpose(2, 0, 1)  # (C, H, W), RGB
        np.testing.assert_array_equal(ds.x[row], want.astype(np.float32) / 255)


def test_channels_are_rgb_in_order(tmp_path: Path, cache: Path) -> None:
    for split in ("train", "test"):
        red = np.zeros((32, 32, 3), np.uint8)
        red[..., 0] = 255
        write_image(tmp_path / "imgs" / split / "red" / "0.png", red, "PNG")
    ds = _load(tmp_path)
    assert ds.x[:, 0].min() == 1.0 and ds.x[:, 1:].max() == 0.0
    # normalize: per channel, after the scaling to [0, 1]; the cached pixels are not changed
    std = _load(tmp_path, normalize={"mean": [0.5, 0.0, 0.25], "std": [0.25, 1.0, 0.5]})
    assert std.x[:, 0].min() == 2.0 and std.x[:, 1].max() == 0.0 and std.x[:, 2].max() == -0.5
    assert _load(tmp_path).x[:, 0].min() == 1.0
    with pytest.raises(ValueError, match="normalize has 1 channels, the images have 3"):
        _load(tmp_path, normalize={"mean": [0.5], "std": [0.25]})


def test_grey_and_rgba_modes_and_other_image_formats(tmp_path: Path, cache: Path) -> None:
    write_image_folder(tmp_path / "grey", mode="L", fmt="PNG", size=(28, 28))
    ds = _load(tmp_path, "grey", mode="L")
    assert ds.x.shape == (18, 1, 28, 28)
    np.testing.assert_array_equal(ds.x[0, 0], image_pixels(0, 0, (28, 28), 1) / np.float32(255))
    write_image_folder(tmp_path / "rgba", mode="RGBA", fmt="PNG", per_class=(1, 1))
    assert _load(tmp_path, "rgba", mode="RGBA").x.shape == (6, 4, 32, 32)
    write_image_folder(tmp_path / "bmp", fmt="BMP", per_class=(1, 1), size=(8, 16))
    assert _load(tmp_path, "bmp", size=[8, 16]).input_shape == (3, 8, 16)


def test_subfolders_hidden_and_other_files(tmp_path: Path, cache: Path) -> None:
    folder = write_image_folder(tmp_path / "imgs", classes=("a",), per_class=(1, 1), fmt="PNG")
    write_image(folder / "train" / "a" / "deeper" / "x.PNG", image_pixels(1, 0), "PNG")
    (folder / "train" / "a" / "notes.txt").write_text("not an image")
    (folder / "train" / "a" / ".hidden.png").write_bytes(b"ignored")
    (folder / "train" / ".ipynb_checkpoints").mkdir()  # not a class
    (folder / "test" / "README").write_text("not a class folder")
    ds = _load(tmp_path)
    assert len(ds) == 3 and ds.num_classes == 1  # 0000.png, deeper/x.PNG; test 0000.png


def test_load_dataset_reads_the_env_root_and_registers_the_config(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedcomm.config import DataConfig

    write_image_folder(tmp_path / "sets" / "tiny", per_class=(1, 1))
    monkeypatch.setenv("FEDCOMM_DATA_ROOT", str(tmp_path))
    cfg = DataConfig(dataset={"name": "image_folder", "path": "sets/tiny"})  # type: ignore[arg-type]
    assert len(load_dataset(cfg.dataset.name, None, **cfg.options())) == 6


# --- options ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({}, "option path is required"),
        ({"path": ""}, "path=''"),
        ({"path": 3}, "expected a non-empty string"),
        ({"path": "/abs/imgs"}, "relative to the data root"),
        ({"path": "../imgs"}, "relative to the data root"),
        ({"path": "imgs", "mode": "CMYK"}, r"mode='CMYK': expected one of \['L', 'RGB', 'RGBA'\]"),
        ({"path": "imgs", "size": [32]}, r"size=\[32\]: expected \[height, width\]"),
        ({"path": "imgs", "size": [32, 0]}, "two integers >= 1"),
        ({"path": "imgs", "colour": "RGB"}, "unknown options"),
        ({"path": "imgs", "normalize": {"mean": [0.5]}}, r"normalize=.*expected \{mean"),
        ({"path": "imgs", "normalize": {"mean": [0.5], "std": [-1]}}, "stds > 0"),
    ],
)
def test_bad_options(tmp_path: Path, options: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_dataset("image_folder", tmp_path, **options)


def test_params_refuse_a_path_outside_the_data_root() -> None:
    from fedcomm.config import ConfigError, validate_params
    from tests.conftest import tiny_params

    for bad in ("/data/cifar10_jpeg", "../cifar10_jpeg", "~/cifar10_jpeg"):
        raw = tiny_params(**{"data.dataset": {"name": "image_folder", "path": bad}})
        with pytest.raises(ConfigError, match=r"data\.dataset\.path: must be a folder relative"):
            validate_params(raw)


# --- the decode cache -----------------------------------------------------------------------


def test_decoded_once_then_read_from_the_cache(
    tmp_path: Path, cache: Path, decodes: list[int]
) -> None:
    write_image_folder(tmp_path / "imgs")
    first = _load(tmp_path)
    assert decodes == [18] and len(_cache_files(cache)) == 1
    again = _load(tmp_path)
    assert decodes == [18]  # not decoded again
    np.testing.assert_array_equal(first.x, again.x)
    np.testing.assert_array_equal(first.y, again.y)
    assert first.fingerprint() == again.fingerprint()
    shutil.move(tmp_path / "imgs", tmp_path / "moved")  # the key is content, not location
    assert _load(tmp_path, "moved").fingerprint() != first.fingerprint()  # (name differs)
    assert decodes == [18]


@pytest.mark.parametrize("change", ["bytes", "rename", "reclass", "mode"])
def test_any_content_change_decodes_afresh(
    tmp_path: Path, cache: Path, decodes: list[int], change: str
) -> None:
    folder = write_image_folder(
        tmp_path / "imgs", fmt="PNG", mode="L" if change == "mode" else "RGB"
    )
    opts = {"mode": "L"} if change == "mode" else {}
    before = _load(tmp_path, **opts)
    img = folder / "train" / "cat" / "0001.png"
    if change == "bytes":
        write_image(img, image_pixels(99, 0), "PNG")
    elif change == "rename":
        img.rename(img.with_name("0009.png"))  # same bytes, now last in its class
    elif change == "reclass":
        img.rename(folder / "train" / "dog" / "0009.png")  # same bytes, another label
    else:  # the same files decoded as another mode are another cache entry
        shutil.rmtree(folder)
        write_image_folder(folder, fmt="PNG", mode="RGB")
        opts = {}
    after = _load(tmp_path, **opts)
    assert decodes == [18, 18] and len(_cache_files(cache)) == 2
    assert before.fingerprint() != after.fingerprint()


def _damage_cache(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncated":
        path.write_bytes(bytes(data[: len(data) // 2]))
    elif how == "flipped":  # one pixel byte deep inside x: zip and npy headers still parse
        data[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(data))
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "repacked":  # a well-formed file whose pixels differ from its recorded digest
        with np.load(path) as z:
            members = {k: z[k] for k in z.files}
        members["x"][0, 0, 0, 0] ^= 1
        with open(path, "wb") as f:
            np.savez(f, **members)
    else:  # a valid npz of other arrays
        with open(path, "wb") as f:
            np.savez(f, x=np.zeros((1, 3, 2, 2), np.uint8), y=np.zeros(1, np.int64))


@pytest.mark.parametrize("how", ["truncated", "flipped", "empty", "other", "repacked"])
def test_a_damaged_cache_file_is_reported_and_rebuilt(
    tmp_path: Path, cache: Path, decodes: list[int], how: str
) -> None:
    write_image_folder(tmp_path / "imgs")
    good = _load(tmp_path)
    (name,) = _cache_files(cache)
    _damage_cache(cache / name, how)
    with pytest.warns(CacheWarning, match=r"decode cache .*; ignoring it and decoding") as rec:
        again = _load(tmp_path)
    assert str(cache / name) in str(rec[0].message) and "\n" not in str(rec[0].message)
    assert decodes == [18, 18]
    np.testing.assert_array_equal(good.x, again.x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # rebuilt: the next load reads it without a word
        _load(tmp_path)
    assert decodes == [18, 18]


def test_cache_off_and_an_unusable_cache_dir(
    tmp_path: Path, decodes: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    write_image_folder(tmp_path / "imgs", per_class=(1, 1))
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache dir should be")
    monkeypatch.setenv(CACHE_ENV, str(blocker))
    a = _load(tmp_path, cache=False)
    with pytest.warns(CacheWarning, match=f"cannot use the decode cache.*set {CACHE_ENV}"):
        b = _load(tmp_path)
    assert decodes == [6, 6] and blocker.read_text().startswith("a file")
    np.testing.assert_array_equal(a.x, b.x)


def test_cache_dir_defaults(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "fedcomm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_root() == Path.home() / ".cache" / "fedcomm"
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_float_conversion_is_the_usual_one() -> None:
    x8 = np.arange(256, dtype=np.uint8)
    out = np.empty(256, np.float32)
    np.divide(x8, np.float32(255), out=out)  # what the loader does, in one pass
    np.testing.assert_array_equal(out, x8.astype(np.float32) / 255.0)


# --- bad input: one line naming the file, and no cache file -------------------------------------


@pytest.mark.parametrize("bad", list(DAMAGES))
def test_bad_input_is_one_line_naming_the_file_and_caches_nothing(
    tmp_path: Path, cache: Path, bad: str
) -> None:
    folder = write_image_folder(tmp_path / "imgs")
    damage, message = DAMAGES[bad]
    damage(folder)
    with pytest.raises((DatasetFileError, DatasetNotFoundError)) as exc:
        _load(tmp_path)
    msg = str(exc.value)
    assert msg.startswith(f"{folder}/") and message in msg and "\n" not in msg, msg
    assert _cache_files(cache) == [] and not any(p.suffix == ".tmp" for p in cache.glob("*"))


def test_a_size_option_is_checked_against_the_images_and_the_cache(
    tmp_path: Path, cache: Path
) -> None:
    folder = write_image_folder(tmp_path / "imgs", per_class=(1, 1))
    first = folder / "train" / "cat" / "0000.jpg"
    with pytest.raises(DatasetFileError, match=r"data\.dataset\.size") as exc:
        _load(tmp_path, size=[28, 28], cache=False)
    assert str(exc.value).startswith(f"{first}: image of 32x32")
    _load(tmp_path)  # cached at the images' size, then asked for another
    with pytest.raises(DatasetFileError, match=r"data\.dataset\.size") as exc:
        _load(tmp_path, size=(28, 28))
    assert str(exc.value).startswith(f"{first}: image of 32x32")
    assert _load(tmp_path, size=(32, 32)).input_shape == (3, 32, 32)


def test_a_missing_folder_names_where_to_put_it(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError) as exc:
        _load(tmp_path, "cifar10_jpeg")
    msg = str(exc.value)
    assert str(tmp_path / "cifar10_jpeg" / "train" / "<class>" / "<image>") in msg
    assert "ImageFolder" in msg and "FEDCOMM_DATA_ROOT" in msg and "\n" not in msg


def test_verify_compares_a_known_release_digest(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = write_image_folder(tmp_path / "imgs", per_class=(2, 1))
    listing = image_files.list_images(folder)
    digest, _ = image_files.content_digests(listing)
    # the digest is of the files concatenated in sorted path order (the README's recipe)
    paths = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.jpg"))
    joined = b"".join((folder / p).read_bytes() for p in paths)
    import hashlib

    assert digest == hashlib.sha256(joined).hexdigest()
    release = Release("the tiny release", ("cat", "dog", "frog"), (6, 3), digest)
    monkeypatch.setattr(image_folder, "RELEASES", (release,))
    assert len(_load(tmp_path)) == 9
    img = folder / "test" / "dog" / "0000.jpg"
    write_image(img, image_pixels(7, 7))  # a plausible image, other bytes
    with pytest.raises(DatasetFileError) as exc:
        _load(tmp_path)
    msg = str(exc.value)
    assert msg.startswith(f"{folder}: sha256 ") and digest in msg and "verify: false" in msg
    assert "fresh copy of the tiny release" in msg and DOCS in msg
    assert len(_load(tmp_path, verify=False)) == 9
    other = Release("other", ("cat", "dog", "frog"), (6, 4), digest)  # other split sizes
    monkeypatch.setattr(image_folder, "RELEASES", (other,))
    assert len(_load(tmp_path)) == 9


# --- the real CIFAR-10 JPEG copy ---------------------------------------------------------------


@pytest.mark.slow
def test_cifar10_jpeg_real() -> None:
    """The decode is right: counts, labels from the sorted class names, RGB order and the
    per-channel statistics of ``cifar10_jpeg/README.md``; the cached load is identical.

    It shares the test session's cache dir (tests/conftest.py) with the CIFAR-10 guards, so the
    60,000 JPEGs are decoded once a session (about 30 s of the suite's time): whichever test
    comes first decodes and caches, and its array is what this one checks, since the cache is
    keyed by every file's bytes and the decoder. Decode and cache on a private cache dir are
    tested on small folders above."""
    if not (SHARED / "cifar10_jpeg" / "train").is_dir():
        if os.environ.get("CI"):
            pytest.fail(f"{SHARED / 'cifar10_jpeg'} is missing")
        pytest.skip("the CIFAR-10 JPEG copy is not on this machine")
    ds = load_dataset("image_folder", SHARED, path="cifar10_jpeg")  # verify: the README's digest
    assert ds.x.shape == (60000, 3, 32, 32) and ds.x.dtype == np.float32 and ds.num_classes == 10
    assert np.bincount(ds.y[:50000]).tolist() == [5000] * 10
    assert np.bincount(ds.y[50000:]).tolist() == [1000] * 10
    assert (np.diff(ds.y[:50000]) >= 0).all() and (np.diff(ds.y[50000:]) >= 0).all()
    readme = {  # split -> (mean, std) per channel R, G, B, from the README (5 decimals)
        "train": ((0.49125, 0.48209, 0.44652), (0.24523, 0.24278, 0.26063)),
        "test": ((0.49407, 0.48506, 0.45038), (0.24485, 0.24220, 0.26058)),
    }
    for split, rows in (("train", slice(0, 50000)), ("test", slice(50000, None))):
        mean, std = readme[split]
        for c in range(3):  # one channel at a time in float64: 400 MB, not 1.2 GB
            x = ds.x[rows, c].astype(np.float64)
            assert abs(x.mean() - mean[c]) < 6e-6 and abs(x.std() - std[c]) < 6e-6, (split, c)
    # airplane 0: the first train image is the file train/airplane/0000.jpg, in RGB order
    from PIL import Image

    with Image.open(SHARED / "cifar10_jpeg" / "train" / "airplane" / "0000.jpg") as im:
        first = np.asarray(im).transpose(2, 0, 1)
    np.testing.assert_array_equal(ds.x[0], first / np.float32(255))
    cached = load_dataset("image_folder", SHARED, path="cifar10_jpeg")
    np.testing.assert_array_equal(cached.x, ds.x)
    assert cached.fingerprint() == ds.fingerprint()
