"""Text windows and vocabularies shared by the text datasets (:mod:`.shakespeare`, :mod:`.ptb`).

Choices (documented because they differ between papers; the datasets' own choices are in their
modules):

* **Windows.** LEAF slides the window by one character, which multiplies the data by the window
  length. Here windows advance by ``stride`` positions, by default ``seq_len`` (non-overlapping).
  A next-character window is ``seq_len`` ids plus the following id as its target; a sequence
  (next-word / PTB) window is ``seq_len + 1`` ids, ``x = w[:-1]`` and ``y = w[1:]``.
* **Vocabularies.** Special tokens first, then tokens by frequency (descending, ties
  alphabetical).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

PAD, UNK, EOS = "<pad>", "<unk>", "<eos>"


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


def stack_windows(
    parts: Sequence[tuple[np.ndarray, np.ndarray]], seq_len: int, y_dims: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Concatenate per-client ``(x, y)`` parts; returns ``x``, ``y`` and ``natural_id``."""
    if not parts:
        y_shape = (0,) if y_dims == 1 else (0, seq_len)
        return np.zeros((0, seq_len), np.int64), np.zeros(y_shape, np.int64), np.zeros(0, np.int64)
    ids = np.concatenate([np.full(len(x), k, dtype=np.int64) for k, (x, _) in enumerate(parts)])
    return np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]), ids
