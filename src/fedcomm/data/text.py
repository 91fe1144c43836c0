"""Text datasets: Shakespeare (next character / next word) and Penn Treebank (next word).

File lookup, option parsing and registration live in :mod:`fedcomm.data.datasets`; this module
turns already located files into :class:`~fedcomm.data.types.Dataset` objects.

Choices (documented because they differ between papers):

* **Characters.** Next-character models use LEAF's 80-symbol alphabet
  :data:`SHAKESPEARE_LETTERS` (id = position in the string, as LEAF's ``letter_to_index``).
  Characters outside it (e.g. ``@``, ``/``, ``_``, ``{``, non-ASCII) are mapped to the space
  character rather than dropped, so window positions stay aligned with the text.
* **Windows.** LEAF slides the window by one character, which multiplies the data by the window
  length. Here windows advance by ``stride`` positions, by default ``seq_len`` (non-overlapping).
  A next-character window is ``seq_len`` ids plus the following id as its target; a sequence
  (next-word / PTB) window is ``seq_len + 1`` ids, ``x = w[:-1]`` and ``y = w[1:]``.
* **Words (Shakespeare).** Text is lower-cased and split into runs of ``[a-z0-9']``; apostrophes
  at either end of a run are stripped (``'tis`` -> ``tis``), punctuation is dropped. Vocabulary:
  ``0 = <pad>``, ``1 = <unk>``, then words by frequency (descending, ties alphabetical) up to
  ``vocab_size`` entries in total, built from the roles that are kept.
* **Roles.** ``min_samples`` and ``max_roles`` select the first roles (in file order) with at
  least ``min_samples`` windows; ``natural_id`` is the index among the kept roles.
* **PTB.** Whitespace tokens plus ``<eos>`` per line (Mikolov / PyTorch example convention);
  vocabulary over all files present, by frequency (descending, ties alphabetical). Windows are
  cut per file, so none spans two splits.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np

from fedcomm.data.types import Dataset
from fedcomm.errors import one_line

ShakespeareTarget = Literal["next_char", "next_word"]
_Seq = TypeVar("_Seq", bound=Sized)

#: LEAF's Shakespeare alphabet (``ALL_LETTERS`` in LEAF's ``language_utils.py``), 80 symbols.
SHAKESPEARE_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)
PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"

_SPACE_ID = SHAKESPEARE_LETTERS.index(" ")
_CHAR_TABLE = np.full(128, _SPACE_ID, dtype=np.int64)  # ASCII code -> letter id
for _i, _c in enumerate(SHAKESPEARE_LETTERS):
    _CHAR_TABLE[ord(_c)] = _i
_WORD_RE = re.compile(r"[a-z0-9']+")


# --- encoding and windows ----------------------------------------------------------------------


def encode_chars(text: str) -> np.ndarray:
    """Map text to ``(len(text),)`` int64 LEAF letter ids; unknown characters become spaces."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
    return np.where(codes < 128, _CHAR_TABLE[np.minimum(codes, 127)], _SPACE_ID)


def char_windows(ids: np.ndarray, seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut ``ids`` into next-character examples.

    Returns:
        ``x`` ``(n, seq_len)`` int64 and ``y`` ``(n,)`` int64, the id right after each window.
    """
    starts = np.arange(0, max(len(ids) - seq_len, 0), stride)  # need ids[s + seq_len]
    x = ids[starts[:, None] + np.arange(seq_len)]  # (n, seq_len)
    return x.astype(np.int64, copy=False), ids[starts + seq_len].astype(np.int64, copy=False)


def sequence_windows(ids: np.ndarray, seq_len: int, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Cut ``ids`` into language-model examples of ``seq_len + 1`` ids each.

    Returns:
        ``x`` ``(n, seq_len)`` and ``y`` ``(n, seq_len)`` int64 with ``y[:, t] = x[:, t + 1]``
        inside the text (``y`` is ``x`` shifted by one).
    """
    starts = np.arange(0, max(len(ids) - seq_len, 0), stride)  # need ids[s + seq_len]
    w = ids[starts[:, None] + np.arange(seq_len + 1)].astype(np.int64, copy=False)  # (n, T + 1)
    return w[:, :-1], w[:, 1:]


def num_windows(length: int, seq_len: int, stride: int) -> int:
    """Number of windows :func:`char_windows` / :func:`sequence_windows` cut from ``length``."""
    return 0 if length <= seq_len else (length - seq_len - 1) // stride + 1


def tokenize_words(text: str) -> list[str]:
    """Lower-cased word tokens of ``text`` (see the module docstring)."""
    return [w for w in (t.strip("'") for t in _WORD_RE.findall(text.lower())) if w]


def build_vocab(
    streams: Iterable[Sequence[str]], specials: Sequence[str] = (), max_size: int | None = None
) -> tuple[str, ...]:
    """``specials`` then tokens by frequency (descending, ties alphabetical), ``max_size`` total."""
    counts = Counter(tok for stream in streams for tok in stream)
    for s in specials:
        counts.pop(s, None)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    vocab = [*specials, *(tok for tok, _ in ranked)]
    return tuple(vocab if max_size is None else vocab[:max_size])


def encode_tokens(tokens: Sequence[str], index: Mapping[str, int], unk: int) -> np.ndarray:
    """``(len(tokens),)`` int64 ids; tokens missing from ``index`` map to ``unk``."""
    return np.fromiter((index.get(t, unk) for t in tokens), dtype=np.int64, count=len(tokens))


def _stack(
    parts: Sequence[tuple[np.ndarray, np.ndarray]], seq_len: int, y_dims: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate per-client ``(x, y)`` parts; returns ``x``, ``y`` and ``natural_id``."""
    if not parts:
        y_shape = (0,) if y_dims == 1 else (0, seq_len)
        return np.zeros((0, seq_len), np.int64), np.zeros(y_shape, np.int64), np.zeros(0, np.int64)
    ids = np.concatenate([np.full(len(x), k, dtype=np.int64) for k, (x, _) in enumerate(parts)])
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]), ids


# --- Shakespeare ---------------------------------------------------------------------------------


def read_roles(path: Path) -> Iterator[tuple[str, str]]:
    """Yield ``("play/role", text)`` from a roles JSONL file (``.gz`` or plain).

    Raises:
        ValueError: ``line N: ...`` for a line that is not JSON or lacks the string fields (the
            caller names the file); reading errors (gzip, UTF-8) propagate as they are.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"line {lineno}: not valid JSON ({one_line(err)})") from err
            if not isinstance(rec, dict) or not all(
                isinstance(rec.get(k), str) for k in ("play", "role", "text")
            ):
                raise ValueError(f"line {lineno}: expected string fields play, role, text")
            yield f"{rec['play']}/{rec['role']}", rec["text"]


def shakespeare_from_roles(
    roles: Iterable[tuple[str, str]],
    *,
    target: ShakespeareTarget,
    seq_len: int,
    stride: int,
    min_samples: int,
    max_roles: int | None,
    vocab_size: int,
) -> Dataset:
    """Build the Shakespeare dataset from ``(name, text)`` roles (one natural client each)."""
    if target == "next_char":
        names, chars = _select_roles(roles, encode_chars, seq_len, stride, min_samples, max_roles)
        x, y, nid = _stack([char_windows(c, seq_len, stride) for c in chars], seq_len, y_dims=1)
        vocab: tuple[str, ...] = tuple(SHAKESPEARE_LETTERS)
    else:
        names, words = _select_roles(roles, tokenize_words, seq_len, stride, min_samples, max_roles)
        vocab = build_vocab(words, specials=(PAD, UNK), max_size=vocab_size)
        index = {tok: i for i, tok in enumerate(vocab)}
        encoded = [encode_tokens(w, index, unk=1) for w in words]
        x, y, nid = _stack([sequence_windows(e, seq_len, stride) for e in encoded], seq_len, 2)
    return _shakespeare(x, y, nid, names, vocab)


def _shakespeare(
    x: np.ndarray, y: np.ndarray, nid: np.ndarray, names: Sequence[str], vocab: tuple[str, ...]
) -> Dataset:
    """The Shakespeare :class:`Dataset`: next-token targets over ``vocab``, one id per role."""
    return Dataset(
        name="shakespeare",
        x=x,
        y=y,
        num_classes=len(vocab),
        task="next_token",
        natural_id=nid,
        natural_names=tuple(names),
        vocab=vocab,
    )


def _select_roles(
    roles: Iterable[tuple[str, str]],
    encode: Callable[[str], _Seq],
    seq_len: int,
    stride: int,
    min_samples: int,
    max_roles: int | None,
) -> tuple[list[str], list[_Seq]]:
    """The first ``max_roles`` roles with at least ``min_samples`` windows, encoded."""
    names: list[str] = []
    kept: list[_Seq] = []
    for name, text in roles:
        if max_roles is not None and len(names) >= max_roles:
            break
        seq = encode(text)
        if num_windows(len(seq), seq_len, stride) >= max(min_samples, 1):
            names.append(name)
            kept.append(seq)
    return names, kept


def shakespeare_from_leaf(
    users: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    seq_len: int | None,
    min_samples: int,
    max_roles: int | None,
) -> Dataset:
    """Build next-character Shakespeare from LEAF user records (``{"x": [str], "y": [str]}``).

    Records of the same user (e.g. its train and test part) are merged in the given order.
    """
    merged: dict[str, tuple[list[str], list[str]]] = {}
    for uid, rec in users:
        xs, ys = merged.setdefault(uid, ([], []))
        xs.extend(rec["x"])
        ys.extend(rec["y"])
    names: list[str] = []
    parts: list[tuple[np.ndarray, np.ndarray]] = []
    for uid, (xs, ys) in merged.items():
        if max_roles is not None and len(names) >= max_roles:
            break
        if len(xs) < max(min_samples, 1):
            continue
        parts.append(_leaf_user_arrays(uid, xs, ys, seq_len))
        names.append(uid)
    width = seq_len if seq_len is not None else (parts[0][0].shape[1] if parts else 80)
    x, y, nid = _stack(parts, width, y_dims=1)
    return _shakespeare(x, y, nid, names, tuple(SHAKESPEARE_LETTERS))


def _leaf_user_arrays(
    uid: str, xs: Sequence[str], ys: Sequence[str], seq_len: int | None
) -> tuple[np.ndarray, np.ndarray]:
    """Encode one LEAF user: ``x`` ``(n, L)`` and ``y`` ``(n,)`` int64."""
    width = len(xs[0])
    if len(xs) != len(ys) or any(len(s) != width for s in xs) or any(len(c) != 1 for c in ys):
        raise ValueError(f"LEAF shakespeare user {uid!r}: ragged x strings or y not single chars")
    if seq_len is not None and seq_len != width:
        raise ValueError(f"LEAF shakespeare windows have {width} characters, seq_len={seq_len}")
    x = encode_chars("".join(xs)).reshape(len(xs), width)  # (n, L)
    return x, encode_chars("".join(ys))  # (n,)


# --- Penn Treebank -------------------------------------------------------------------------------


def ptb_tokens(content: str) -> list[str]:
    """Whitespace tokens of Mikolov PTB text with ``<eos>`` after every line (lines split as a
    file opened in text mode splits them: at LF, CRLF or CR)."""
    return [tok for line in io.StringIO(content, newline=None) for tok in (*line.split(), EOS)]


def read_ptb_tokens(path: Path) -> list[str]:
    """Whitespace tokens of a Mikolov PTB file with ``<eos>`` after every line."""
    with open(path, encoding="utf-8") as f:
        return ptb_tokens(f.read())


def ptb_from_streams(streams: Sequence[list[str]], *, seq_len: int) -> Dataset:
    """Build PTB next-word windows (``x`` and ``y`` ``(n, seq_len)``) from token streams."""
    vocab = build_vocab(streams)
    index = {tok: i for i, tok in enumerate(vocab)}
    parts = [sequence_windows(encode_tokens(s, index, 0), seq_len, seq_len) for s in streams]
    x, y, _ = _stack([p for p in parts if len(p[0])], seq_len, y_dims=2)
    return Dataset(name="ptb", x=x, y=y, num_classes=len(vocab), task="next_token", vocab=vocab)
