"""The LEAF JSON format (``femnist`` and next-character ``shakespeare``): finding the shards
of a split and reading their users' records.

A shard is ``{"users": [...], "user_data": {user: record}}`` (``.json`` or ``.json.gz``); each
record is checked by the dataset's converter before any user of the shard is used.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from fedcomm.data.datasets.verify import open_data, reading

_T = TypeVar("_T")


def _leaf_files(folder: Path) -> list[Path]:
    """Sorted ``*.json`` / ``*.json.gz`` files of a LEAF split folder."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.name.endswith((".json", ".json.gz")))


def find_leaf(root: Path | None, bases: Sequence[str]) -> tuple[list[Path], list[Path]] | None:
    """Train and test LEAF files under the first base folder that has any."""
    if root is None:
        return None
    for base in bases:
        train, test = _leaf_files(root / base / "train"), _leaf_files(root / base / "test")
        if train or test:
            return train, test
    return None


def iter_leaf_users(
    files: Sequence[Path], release: str, convert: Callable[[str, Any], _T]
) -> Iterator[tuple[str, _T]]:
    """Yield ``(user id, convert(user id, user_data record))`` in file order, then ``users``
    order. Each file is read and all its records converted (``convert`` raises ``ValueError`` on
    a bad record) before its users are yielded, so a damaged file is named with ``release``."""
    for path in files:
        with reading(path, release):
            with open_data(path) as f:
                blob = json.load(f)
            if not isinstance(blob, dict) or not {"users", "user_data"} <= blob.keys():
                raise ValueError("not LEAF JSON (needs 'users' and 'user_data')")
            users, data = blob["users"], blob["user_data"]
            if not isinstance(users, list) or not isinstance(data, dict) or not users:
                raise ValueError("not LEAF JSON ('users' must be a non-empty list of user ids)")
            records = []
            for uid in users:
                if not isinstance(uid, str) or not isinstance(data.get(uid), dict):
                    raise ValueError(f"user {uid!r} in 'users' has no record in 'user_data'")
                records.append((uid, convert(uid, data[uid])))
        yield from records
