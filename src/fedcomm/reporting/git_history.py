"""Git history for the claims registry's registrations: plain ``git -C <root> ...`` calls,
cached by commit (a commit's content never changes) or by HEAD (the history a log walks)."""

from __future__ import annotations

import re
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from fedcomm.errors import InputError

FULL_HASH = re.compile(r"[0-9a-f]{40}")


class RegistrationError(InputError):
    """git is missing, or the folder is not a git repository; one line."""


def git(root: Path | str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, check=False
        )
    except FileNotFoundError as err:
        raise RegistrationError(
            "git is not installed (or not on PATH); it is needed to check claim registrations"
        ) from err
    if proc.returncode == 128 and "not a git repository" in proc.stderr:
        raise RegistrationError(
            f"{root} is not a git repository; registrations are read from its git history"
        )
    if check and proc.returncode != 0:
        msg = " ".join(proc.stderr.split()) or f"exit {proc.returncode}"
        raise RegistrationError(f"git {' '.join(args)} failed in {root}: {msg}")
    return proc


def require_repo(root: Path | str) -> None:
    if not Path(root).is_dir():
        raise RegistrationError(f"{root} is not a git repository (no such folder)")
    git(root, "rev-parse", "--git-dir")


def resolve(root: Path | str, rev: str) -> str | None:
    """The full hash of commit ``rev``, or None when there is no such commit."""
    proc = git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}", check=False)
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def head(root: Path | str) -> str:
    return resolve(root, "HEAD") or ""


# Cached by HEAD (the history a log walks) or by full commit hashes: both never change.
@lru_cache(maxsize=4096)
def log(root: str, head: str, *args: str) -> tuple[str, ...]:
    if not head:
        return ()
    return tuple(git(root, "log", *args).stdout.split())


@lru_cache(maxsize=1024)
def file_at(root: str, commit: str, rel: str) -> str | None:
    proc = git(root, "show", f"{commit}:{rel}", check=False)
    return proc.stdout if proc.returncode == 0 else None


@lru_cache(maxsize=1024)
def yaml_at(root: str, commit: str, rel: str) -> Any:
    text = file_at(root, commit, rel)
    if text is None:
        return None
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)
    except yaml.YAMLError:
        return None


@lru_cache(maxsize=65536)
def is_ancestor(root: str, older: str, newer: str) -> bool:
    proc = git(root, "merge-base", "--is-ancestor", older, newer, check=False)
    return proc.returncode == 0


def first_added(root: Path | str, path: str) -> str | None:
    """The full hash of the oldest commit (in HEAD's history) that added ``path``, relative to
    ``root``; None when no commit added it (untracked, or only staged)."""
    require_repo(root)
    added = log(str(root), head(root), "--diff-filter=A", "--format=%H", "--", path)
    return added[-1] if added else None


def is_strict_ancestor(root: Path | str, older: str, newer: str) -> bool:
    """Whether commit ``older`` is an ancestor of ``newer`` and not the same commit."""
    require_repo(root)
    old, new = resolve(root, older), resolve(root, newer)
    if old is None or new is None or old == new:
        return False
    return is_ancestor(str(root), old, new)
