"""The shared command line of the pipeline's page reports (system_study_report.py,
time_policies_report.py): a results block computed from committed data, printed, written into
its page between two markers (with the figures), or checked against it.

    run(doc, load=..., block=..., figures=..., data=..., page=..., img=..., begin=..., end=...)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def run(
    doc: str,
    *,
    load: Callable[[Path], T],
    block: Callable[[T], str],
    figures: Callable[[T, Path], None],
    data: Path,
    page: Path,
    img: Path,
    begin: str,
    end: str,
) -> int:
    """The report's ``main``: ``--write`` rewrites the page's block and the figures, ``--check``
    exits 1 if the page is out of date, neither prints the block (``--data``, ``--page``,
    ``--img`` replace the defaults). Exit 2: no data, or no block in the page."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the page's block and figures")
    mode.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    p.add_argument("--data", type=Path, default=data)
    p.add_argument("--page", type=Path, default=page)
    p.add_argument("--img", type=Path, default=img)
    args = p.parse_args()
    loaded = load(args.data)
    if not loaded:
        print(f"no curves under {args.data}", file=sys.stderr)
        return 2
    text = block(loaded)
    if not (args.write or args.check):
        print(text)
        return 0
    current = args.page.read_text()
    pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
    found = pattern.search(current)
    if found is None:
        print(f"{args.page}: no {begin} ... {end} block", file=sys.stderr)
        return 2
    if args.check:
        if found.group(0) != text:
            print(
                f"{args.page}: out of date; run {Path(sys.argv[0]).name} --write", file=sys.stderr
            )
            return 1
        return 0
    args.page.write_text(pattern.sub(lambda _: text, current))
    figures(loaded, args.img)
    return 0
