"""The plot pages' JavaScript bundle kept in the cache dir: bundled once, read back by the next
process, bundled again when the file is damaged, and still served when the cache dir cannot be
written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vl_convert

from fedcomm.paths import CACHE_ENV
from fedcomm.reporting import vega_page


@pytest.fixture
def bundles(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[list[str]]:
    """vl-convert's bundling, counted; a fresh cache dir; the in-process memo cleared (as in a
    new process) before and after."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    calls: list[str] = []
    real = vl_convert.javascript_bundle

    def counted(*args: Any, **kwargs: Any) -> str:
        calls.append("bundled")
        return str(real(*args, **kwargs))

    monkeypatch.setattr(vega_page.vl_convert, "javascript_bundle", counted)
    vega_page.vega_javascript.cache_clear()
    yield calls
    vega_page.vega_javascript.cache_clear()


def _cached(tmp_path: Path) -> Path:
    (path,) = (tmp_path / "cache" / "vega").glob("*.js")
    return path


def test_bundled_once_then_read_from_the_cache_dir(bundles: list[str], tmp_path: Path) -> None:
    first = vega_page.vega_javascript()
    assert "vegaEmbed" in first and bundles == ["bundled"]
    vega_page.vega_javascript.cache_clear()  # the next process
    assert vega_page.vega_javascript() == first
    assert bundles == ["bundled"]
    assert _cached(tmp_path).read_text().endswith(first)


def test_a_damaged_cache_file_is_bundled_again(bundles: list[str], tmp_path: Path) -> None:
    first = vega_page.vega_javascript()
    path = _cached(tmp_path)
    path.write_text(path.read_text()[:-100])  # cut short
    vega_page.vega_javascript.cache_clear()
    assert vega_page.vega_javascript() == first
    assert bundles == ["bundled", "bundled"]
    vega_page.vega_javascript.cache_clear()
    assert vega_page.vega_javascript() == first and len(bundles) == 2  # rewritten whole


def test_an_unwritable_cache_dir_costs_only_the_bundling(
    bundles: list[str], tmp_path: Path
) -> None:
    (tmp_path / "cache").write_text("a file where the cache dir should be")
    first = vega_page.vega_javascript()
    vega_page.vega_javascript.cache_clear()
    assert vega_page.vega_javascript() == first
    assert bundles == ["bundled", "bundled"]
