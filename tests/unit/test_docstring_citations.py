"""Docstrings and comments cite papers, not files outside the repository or issue numbers.

A reader of ``src/fedcomm`` has neither the project's spec notes (``specs/...md``) nor its paper
text dumps (``papers/...txt``), and an issue number says nothing about the code: a reference
names the paper (title or first author and year, section, equation / table / figure /
algorithm) or the public official code (``bibikar/feddst``, ``a514514772/ProgFed``), and what
an issue introduced is said in words ("simulated time"). One test per source file.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "fedcomm"

FORBIDDEN = re.compile(
    r"specs/"  # spec notes kept outside the repository
    r"|papers/"  # paper text kept outside the repository
    r"|\b[Ii]ssues? #?\d+"  # "issue 30", "issues 29", "Issue #41"
    r"|\bissue-\d+"  # "issue-18"
    r"|#\d{2}\b"  # "#30" (not a colour such as "#222" or "#1f77b4")
)


def _sources() -> list[object]:
    return [
        pytest.param(path, id=path.relative_to(PACKAGE).as_posix())
        for path in sorted(PACKAGE.rglob("*.py"))
    ]


def test_package_found() -> None:
    assert len(list(PACKAGE.rglob("*.py"))) > 50


@pytest.mark.parametrize("path", _sources())
def test_no_outside_file_or_issue_reference(path: Path) -> None:
    hits = [
        f"{path.relative_to(PACKAGE)}:{number}: {match.group()!r} in {line.strip()!r}"
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        for match in FORBIDDEN.finditer(line)
    ]
    assert not hits, "cite the paper or say what the issue introduced:\n" + "\n".join(hits)
