"""``shakespeare``: next character (LEAF JSON, else the roles JSONL) or next word (roles JSONL).

Choices (documented because they differ between papers; windows: :mod:`.text`):

* **Characters.** Next-character models use LEAF's 80-symbol alphabet
  :data:`SHAKESPEARE_LETTERS` (id = position in the string, as LEAF's ``letter_to_index``).
  Characters outside it (e.g. ``@``, ``/``, ``_``, ``{``, non-ASCII) are mapped to the space
  character rather than dropped, so window positions stay aligned with the text.
* **Words.** Text is lower-cased and split into runs of ``[a-z0-9']``; apostrophes at either end
  of a run are stripped (``'tis`` -> ``tis``), punctuation is dropped. Vocabulary: ``0 = <pad>``,
  ``1 = <unk>``, then words by frequency (descending, ties alphabetical) up to ``vocab_size``
  entries in total, built from the roles that are kept.
* **Roles.** ``min_samples`` and ``max_roles`` select the first roles (in file order) with at
  least ``min_samples`` windows; ``natural_id`` is the index among the kept roles.
* ``target="next_word"`` always reads ``roles.jsonl.gz`` (LEAF JSON holds next-char windows
  only). Roles records need string ``play``, ``role`` and ``text``.
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Sized
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import numpy as np

from fedcomm.data.datasets.leaf import find_leaf, iter_leaf_users
from fedcomm.data.datasets.options import Options
from fedcomm.data.datasets.registry import register
from fedcomm.data.datasets.text import (
    PAD,
    UNK,
    build_vocab,
    char_windows,
    encode_tokens,
    num_windows,
    sequence_windows,
    stack_windows,
)
from fedcomm.data.datasets.verify import not_found, reading
from fedcomm.data.types import Dataset
from fedcomm.errors import one_line

ShakespeareTarget = Literal["next_char", "next_word"]
_Seq = TypeVar("_Seq", bound=Sized)

#: LEAF's Shakespeare alphabet (``ALL_LETTERS`` in LEAF's ``language_utils.py``), 80 symbols.
SHAKESPEARE_LETTERS = (
    "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
)

_SPACE_ID = SHAKESPEARE_LETTERS.index(" ")
_CHAR_TABLE = np.full(128, _SPACE_ID, dtype=np.int64)  # ASCII code -> letter id
for _i, _c in enumerate(SHAKESPEARE_LETTERS):
    _CHAR_TABLE[ord(_c)] = _i
_WORD_RE = re.compile(r"[a-z0-9']+")


def encode_chars(text: str) -> np.ndarray:
    """Map text to ``(len(text),)`` int64 LEAF letter ids; unknown characters become spaces."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.int64)
    return np.where(codes < 128, _CHAR_TABLE[np.minimum(codes, 127)], _SPACE_ID)


def tokenize_words(text: str) -> list[str]:
    """Lower-cased word tokens of ``text`` (see the module docstring)."""
    return [w for w in (t.strip("'") for t in _WORD_RE.findall(text.lower())) if w]


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
        x, y, nid = stack_windows(
            [char_windows(c, seq_len, stride) for c in chars], seq_len, y_dims=1
        )
        vocab: tuple[str, ...] = tuple(SHAKESPEARE_LETTERS)
    else:
        names, words = _select_roles(roles, tokenize_words, seq_len, stride, min_samples, max_roles)
        vocab = build_vocab(words, specials=(PAD, UNK), max_size=vocab_size)
        index = {tok: i for i, tok in enumerate(vocab)}
        encoded = [encode_tokens(w, index, unk=1) for w in words]
        x, y, nid = stack_windows(
            [sequence_windows(e, seq_len, stride) for e in encoded], seq_len, 2
        )
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
    x, y, nid = stack_windows(parts, width, y_dims=1)
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


# --- the loader -----------------------------------------------------------------------------------


def _shakespeare_user(uid: str, rec: Mapping[str, Any]) -> Mapping[str, Any]:
    """One LEAF Shakespeare role, checked: ``x`` equally long strings, ``y`` single characters."""
    xs, ys = rec.get("x"), rec.get("y")
    if not isinstance(xs, list) or not isinstance(ys, list) or len(xs) != len(ys):
        raise ValueError(f"user {uid!r}: needs 'x' and 'y' lists of the same length")
    if not all(isinstance(s, str) and len(s) == len(xs[0]) for s in xs) or not all(
        isinstance(c, str) and len(c) == 1 for c in ys
    ):
        raise ValueError(f"user {uid!r}: ragged x strings or y not single characters")
    return rec


@register("shakespeare")
def _load_shakespeare(root: Path | None, options: Mapping[str, Any]) -> Dataset:
    """Shakespeare next-char (LEAF JSON, else roles JSONL) or next-word (roles JSONL).

    See :mod:`fedcomm.data.text` for windows, vocabularies and role selection.
    """
    o = Options(
        "shakespeare",
        options,
        ("target", "seq_len", "stride", "max_roles", "min_samples", "vocab_size"),
    )
    target = o.choice("target", "next_char", ("next_char", "next_word"))
    seq_len, stride = o.optional_integer("seq_len", 1), o.optional_integer("stride", 1)
    max_roles, min_samples = o.optional_integer("max_roles", 1), o.integer("min_samples", 2, 0)
    vocab_size = o.integer("vocab_size", 10000, 3)
    leaf = find_leaf(root, ("shakespeare",)) if target == "next_char" else None
    if leaf is not None:
        if stride is not None:
            raise ValueError("shakespeare: option stride does not apply to LEAF JSON windows")
        release = "the LEAF Shakespeare shard, or remove it"
        users = iter_leaf_users([*leaf[0], *leaf[1]], release, _shakespeare_user)
        return shakespeare_from_leaf(
            users, seq_len=seq_len, min_samples=min_samples, max_roles=max_roles
        )
    roles = root / "shakespeare" / "roles.jsonl.gz" if root is not None else None
    if roles is None or not roles.is_file():
        note = " (or, for next_char, LEAF JSON in shakespeare/{train,test}/*.json)"
        raise not_found("shakespeare", root, ["shakespeare/roles.jsonl.gz"], note)
    seq_len = seq_len or (80 if target == "next_char" else 20)
    return shakespeare_from_roles(
        _read_roles(roles),
        target=cast(ShakespeareTarget, target),
        seq_len=seq_len,
        stride=stride or seq_len,
        min_samples=min_samples,
        max_roles=max_roles,
        vocab_size=vocab_size,
    )


def _read_roles(path: Path) -> list[tuple[str, str]]:
    """All ``("play/role", text)`` of a roles JSONL file, read to its end (so damage anywhere
    in it is found, whatever ``max_roles`` keeps)."""
    with reading(path, "the Shakespeare roles file"):
        roles = list(read_roles(path))
        if not roles:
            raise ValueError("holds no roles")
    return roles
