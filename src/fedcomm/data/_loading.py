"""What every dataset loader shares: the errors for missing and damaged files and the options
reader.

:func:`reading` is the one place a reader's or parser's failure becomes a
:class:`DatasetFileError` naming the file and the remedy; :func:`not_found` builds the
:class:`DatasetNotFoundError` that says which files to put where (see :mod:`fedcomm.data.datasets`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from fedcomm.errors import InputError, one_line

DATA_ROOT_ENV = "FEDCOMM_DATA_ROOT"


class DatasetNotFoundError(InputError, FileNotFoundError):
    """A dataset's files are not under the data root; the message says what to put where."""


class DatasetFileError(InputError, ValueError):
    """A dataset file is present but empty, truncated, corrupted or of another format or version;
    the one-line message names the file, what is wrong and the remedy."""


def not_found(
    name: str, root: Path | None, wanted: Sequence[str], note: str = ""
) -> DatasetNotFoundError:
    """A :class:`DatasetNotFoundError` listing ``wanted`` (paths relative to the root)."""
    if root is None:
        head = f"dataset {name!r} needs local files but no data root is set"
        files = ", ".join(f"<data root>/{w}" for w in wanted)
    else:
        head = f"dataset {name!r} not found under data root {root}"
        files = ", ".join(str(root / w) for w in wanted)
    tail = f"; set data.root in params.yaml or {DATA_ROOT_ENV} to the folder holding them"
    return DatasetNotFoundError(f"{head}; expected: {files}{note}{tail}")


DOCS = "docs/configuration.md"


def damaged(path: Path, problem: str, release: str, *, own_copy: bool = False) -> DatasetFileError:
    """``path: problem; replace it with a fresh copy of <release> (see the docs)``, one line.

    ``own_copy``: the problem is a difference from the standard release, which ``verify: false``
    accepts (a user's own copy).
    """
    alt = ", or set data.dataset.verify: false to use your own copy" if own_copy else ""
    return DatasetFileError(
        f"{path}: {' '.join(problem.split())}; replace it with a fresh copy of {release}{alt}"
        f" (see {DOCS})"
    )


def problem(err: BaseException, path: Path) -> str:
    """What a reader's or parser's exception says about ``path``, on one line."""
    msg = one_line(err)
    gz = path.suffix == ".gz"
    if isinstance(err, EOFError):
        return f"truncated {'gzip stream' if gz else 'file'} ({msg})"
    if isinstance(err, zlib.error):
        return f"corrupted gzip stream ({msg})"
    if isinstance(err, gzip.BadGzipFile):
        kind = "not gzip-compressed" if msg.startswith("Not a gzipped") else "corrupted gzip stream"
        return f"{kind} ({msg})"
    if isinstance(err, json.JSONDecodeError):
        return f"not valid JSON ({msg})"
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text ({msg})"
    if isinstance(err, KeyError):
        return f"missing key {msg}"
    if isinstance(err, OSError):
        return f"cannot be read ({msg})"
    return msg


#: What reading or parsing a damaged file raises (checks in a reader raise ``ValueError``).
READ_ERRORS = (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError, IndexError)


@contextmanager
def reading(path: Path, release: str) -> Iterator[None]:
    """Read and check ``path`` inside the block: an empty file, or any reader, parser or check
    failure in the block (a ``ValueError`` saying what is wrong), becomes :class:`DatasetFileError`
    naming ``path`` and the remedy (a fresh copy of ``release``)."""
    try:
        if path.stat().st_size == 0:
            raise ValueError("the file is empty")
        yield
    except DatasetFileError:
        raise
    except READ_ERRORS as err:
        raise damaged(path, problem(err, path), release) from err


def check_md5(path: Path, data: bytes, want: str, release: str) -> None:
    """Refuse ``data`` (the content of ``path``) unless its MD5 digest is ``want``."""
    got = hashlib.md5(data, usedforsecurity=False).hexdigest()
    if got != want:
        problem = f"MD5 {got} differs from the standard file's {want} (corrupted or modified)"
        raise damaged(path, problem, release, own_copy=True)


class Options:
    """Typed access to a loader's options; rejects unknown names and ill-typed values."""

    def __init__(self, dataset: str, options: Mapping[str, Any], allowed: Sequence[str]) -> None:
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise ValueError(f"dataset {dataset!r}: unknown options {unknown}; allowed {allowed}")
        self.dataset, self.options = dataset, options

    def _bad(self, key: str, want: str) -> ValueError:
        return ValueError(f"dataset {self.dataset!r}: option {key}={self.options[key]!r}: {want}")

    def flag(self, key: str, default: bool) -> bool:
        v = self.options.get(key, default)
        if not isinstance(v, bool | np.bool_):
            raise self._bad(key, "expected a bool")
        return bool(v)

    def integer(self, key: str, default: int, minimum: int) -> int:
        v = self.optional_integer(key, minimum, default)
        if v is None:
            raise self._bad(key, f"expected an integer >= {minimum}")
        return v

    def optional_integer(self, key: str, minimum: int, default: int | None = None) -> int | None:
        v = self.options.get(key, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < minimum:
            raise self._bad(key, f"expected an integer >= {minimum}")
        return int(v)

    def number(self, key: str, default: float, minimum: float) -> float:
        v = self.options.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float | np.number) or not v >= minimum:
            raise self._bad(key, f"expected a number >= {minimum}")
        return float(v)

    def choice(self, key: str, default: str, choices: Sequence[str]) -> str:
        v = self.options.get(key, default)
        if v not in choices:
            raise self._bad(key, f"expected one of {list(choices)}")
        return str(v)

    def required_string(self, key: str, example: str) -> str:
        if key not in self.options:
            raise ValueError(f"dataset {self.dataset!r}: option {key} is required (e.g. {example})")
        v = self.options[key]
        if not isinstance(v, str) or not v:
            raise self._bad(key, f"expected a non-empty string (e.g. {example})")
        return v


def open_data(path: Path) -> Any:
    """Open ``path`` for binary reading, transparently gunzipping ``*.gz``."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
