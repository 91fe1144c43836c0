"""``ptb``: Penn Treebank (Mikolov's ``ptb.{train,valid,test}.txt``), next-word windows.

Tokens are whitespace tokens plus ``<eos>`` per line (Mikolov / PyTorch example convention); the
vocabulary is built over all files present, by frequency (descending, ties alphabetical).
Windows are cut per file, so none spans two splits. Every file is checked: UTF-8, no control
characters, ends with a newline; option ``verify`` (default ``true``) also requires the standard
alphabet (lower-case ASCII, ``N`` for numbers, punctuation) and compares a file of the standard
size with torchtext's MD5 digest.
"""

from __future__ import annotations

import io
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fedcomm.data.datasets.options import Options
from fedcomm.data.datasets.registry import register
from fedcomm.data.datasets.text import (
    EOS,
    build_vocab,
    encode_tokens,
    sequence_windows,
    stack_windows,
)
from fedcomm.data.datasets.verify import check_md5, damaged, not_found, reading
from fedcomm.data.types import Dataset

#: ``(size, md5)`` of Mikolov's files (torchtext's digests; sizes of the shared data root's copies).
_PTB_MD5 = {
    "ptb.train.txt": (5101618, "f26c4b92c5fdc7b3f8c7cdcb991d8420"),
    "ptb.valid.txt": (399782, "aa0affc06ff7c36e977d7cd49e3839bf"),
    "ptb.test.txt": (449945, "8b80168b89c18661a38ef683c0dc3721"),
}
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")  # tab, LF and CR are text
_NOT_PTB = re.compile(r"[^\n\r -@N\[-~]")  # outside lower-case printable ASCII, N and newlines


def ptb_tokens(content: str) -> list[str]:
    """Whitespace tokens of Mikolov PTB text with ``<eos>`` after every line (lines split as a
    file opened in text mode splits them: at LF, CRLF or CR)."""
    return [tok for line in io.StringIO(content, newline=None) for tok in (*line.split(), EOS)]


def ptb_from_streams(streams: Sequence[list[str]], *, seq_len: int) -> Dataset:
    """Build PTB next-word windows (``x`` and ``y`` ``(n, seq_len)``) from token streams."""
    vocab = build_vocab(streams)
    index = {tok: i for i, tok in enumerate(vocab)}
    parts = [sequence_windows(encode_tokens(s, index, 0), seq_len, seq_len) for s in streams]
    x, y, _ = stack_windows([p for p in parts if len(p[0])], seq_len, y_dims=2)
    return Dataset(name="ptb", x=x, y=y, num_classes=len(vocab), task="next_token", vocab=vocab)


def _read_ptb(path: Path, verify: bool) -> list[str]:
    """Tokens of a Mikolov PTB file (:func:`ptb_tokens`), checked for damage.

    Always: UTF-8, no control characters, ends with a newline (a standard file does; a
    truncated one almost always ends mid-line). With ``verify``: the standard alphabet, and the
    standard digest for a file of the standard size.
    """
    release = "Mikolov's standard PTB file"
    with reading(path, release):
        data = path.read_bytes()
        content = data.decode("utf-8")
        bad = _CONTROL.search(content)
        if bad:
            line = content.count("\n", 0, bad.start()) + 1
            raise ValueError(f"control character {bad.group()!r} on line {line}: corrupted")
        if not content.endswith("\n"):
            raise ValueError("ends mid-line, without the final newline of a whole file: truncated")
        if verify:
            bad = _NOT_PTB.search(content)
            if bad:
                line = content.count("\n", 0, bad.start()) + 1
                problem = (
                    f"character {bad.group()!r} on line {line} is not in the word-level PTB text"
                    " (lower-case ASCII, N for numbers): another file or version in its place"
                )
                raise damaged(path, problem, release, own_copy=True)
            standard = _PTB_MD5.get(path.name)
            if standard is not None and len(data) == standard[0]:
                check_md5(path, data, standard[1], release)
    return ptb_tokens(content)


@register("ptb")
def _load_ptb(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """Penn Treebank (Mikolov): next-word windows from whichever of train/valid/test exist."""
    o = Options("ptb", options, ("seq_len", "verify"))
    seq_len, verify = o.integer("seq_len", 35, 1), o.flag("verify", True)
    names = [f"ptb.{split}.txt" for split in ("train", "valid", "test")]
    for folder in (root / "ptb", root) if root is not None else ():
        paths = [folder / n for n in names if (folder / n).is_file()]
        if paths:
            return ptb_from_streams([_read_ptb(p, verify) for p in paths], seq_len=seq_len)
    raise not_found("ptb", root, [f"ptb/{n}" for n in names], " (any of them; also in the root)")
