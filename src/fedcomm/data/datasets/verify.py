"""The shared verification of dataset files: the errors for missing and damaged files, the
reading guard and the digest check every loader uses.

:func:`not_found` builds the :class:`DatasetNotFoundError` that names the files to put where;
:func:`reading` is the one place a reader's or parser's failure becomes a
:class:`DatasetFileError` naming the file and the remedy (a fresh copy, see
``docs/configuration.md``); :func:`check_md5` compares a file with its standard release.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

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


def open_data(path: Path) -> Any:
    """Open ``path`` for binary reading, transparently gunzipping ``*.gz``."""
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")
