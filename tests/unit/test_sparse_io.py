"""Sparse model files: exact reload, the cheapest layout per tensor, atomic writes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import Tensor
from torch.func import functional_call

from fedcomm import sparse_io
from fedcomm.models import build_model
from fedcomm.sparse_io import load_sparse, save_sparse


def _with_density(shape: tuple[int, ...], density: float, seed: int = 0) -> Tensor:
    """Random values with exactly ``round(density · numel)`` non-zeros."""
    g = torch.Generator().manual_seed(seed)
    numel = 1
    for s in shape:
        numel *= s
    flat = torch.zeros(numel)
    keep = torch.randperm(numel, generator=g)[: round(density * numel)]
    flat[keep] = torch.rand(len(keep), generator=g) + 0.5  # non-zero values
    return flat.reshape(shape)


def _assert_same(a: dict[str, Tensor], b: dict[str, Tensor]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].shape == b[k].shape, k
        assert a[k].dtype == b[k].dtype, k
        assert torch.equal(a[k], b[k]), k


def test_layouts_and_exact_reload(tmp_path: Path) -> None:
    params = {
        # dense: 1000 · 4 B = 4000 B beats any sparse layout
        "dense": torch.randn(10, 100),
        # 90% zeros, 1000 entries, 100 non-zeros: bitmap 400 + 125 = 525 B < coo 100 · 8 = 800 B
        "sparse90": _with_density((10, 100), 0.10),
        # 99.9% zeros, 10,000 entries, 10 non-zeros: coo 10 · 8 = 80 B < bitmap 40 + 1250 B
        "sparse999": _with_density((100, 100), 0.001),
        "zeros": torch.zeros(3, 7),  # coo with no entries
        "scalar": torch.tensor(2.5),
        "odd": _with_density((13,), 0.3),  # bitmap not a multiple of 8 bits
    }
    path = tmp_path / "model.safetensors"
    layouts = save_sparse(params, path)
    assert layouts == {
        "dense": "dense",
        "sparse90": "bitmap",
        "sparse999": "coo",
        "zeros": "coo",
        "scalar": "dense",
        # 13 entries, 4 non-zeros: dense 52 B, bitmap 16 + 2 = 18 B, coo 4 · 8 = 32 B
        "odd": "bitmap",
    }
    _assert_same(load_sparse(path), params)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64])
def test_other_dtypes_reload_exactly(tmp_path: Path, dtype: torch.dtype) -> None:
    params = {
        "sparse": _with_density((50, 20), 0.05).to(dtype),
        "dense": (torch.randn(4, 4) * 10).to(dtype),
    }
    save_sparse(params, tmp_path / "m.safetensors")
    _assert_same(load_sparse(tmp_path / "m.safetensors"), params)


def test_non_contiguous_tensor(tmp_path: Path) -> None:
    t = _with_density((20, 30), 0.05).t()  # transposed view
    assert not t.is_contiguous()
    save_sparse({"t": t}, tmp_path / "m.safetensors")
    assert torch.equal(load_sparse(tmp_path / "m.safetensors")["t"], t)


def test_sparse_file_is_smaller_than_dense(tmp_path: Path) -> None:
    dense = {"a": torch.randn(200, 100) + 5.0, "b": torch.randn(1000) + 5.0}  # no zeros
    sparse = {k: v * (_with_density(tuple(v.shape), 0.05, seed=1) != 0) for k, v in dense.items()}
    assert sum(int(torch.count_nonzero(v)) for v in sparse.values()) == 1050  # 5% of 21,000
    save_sparse(dense, tmp_path / "dense.safetensors")
    save_sparse(sparse, tmp_path / "sparse.safetensors")
    dense_size = (tmp_path / "dense.safetensors").stat().st_size
    sparse_size = (tmp_path / "sparse.safetensors").stat().st_size
    assert dense_size > 21_000 * 4  # all values as fp32
    # 95% zeros: bitmap 21,000 / 8 B + 1050 · 4 B ≈ 6.8 kB, about 1/12 of the dense file
    assert sparse_size < dense_size / 8


def test_reloaded_pruned_cnn_predicts_identically(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = build_model("cnn", input_shape=(3, 32, 32), num_classes=10)
    params = {}
    for name, p in model.named_parameters():
        w = p.detach().clone()
        cutoff = w.abs().flatten().kthvalue(max(1, int(0.9 * w.numel()))).values
        params[name] = torch.where(w.abs() > cutoff, w, torch.zeros_like(w))  # keep the top 10%
    path = tmp_path / "cnn.safetensors"
    layouts = save_sparse(params, path)
    assert set(layouts.values()) != {"dense"}
    loaded = load_sparse(path)
    _assert_same(loaded, params)
    x = torch.randn(4, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = functional_call(model, params, (x,))
        got = functional_call(model, loaded, (x,))
    assert torch.equal(got, expected)


def test_write_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "sub" / "m.safetensors"
    save_sparse({"w": torch.randn(5)}, path)
    assert [p.name for p in path.parent.iterdir()] == ["m.safetensors"]  # no temp file left
    before = path.read_bytes()

    def broken(tensors: dict[str, Tensor], filename: str, metadata: object = None) -> None:
        Path(filename).write_bytes(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(sparse_io, "save_file", broken)
    with pytest.raises(OSError, match="disk full"):
        save_sparse({"w": torch.zeros(5)}, path)
    assert path.read_bytes() == before  # the old file is intact


def test_overwrite_replaces(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    save_sparse({"w": torch.randn(5)}, path)
    new = {"v": _with_density((100,), 0.02)}
    save_sparse(new, path)
    _assert_same(load_sparse(path), new)


def test_rejects_foreign_safetensors(tmp_path: Path) -> None:
    path = tmp_path / "plain.safetensors"
    save_file({"w": torch.randn(3)}, str(path))
    with pytest.raises(ValueError, match="not a fedcomm sparse model file"):
        load_sparse(path)
    save_file({"w": torch.randn(3)}, str(path), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="not a fedcomm sparse model file"):
        load_sparse(path)
