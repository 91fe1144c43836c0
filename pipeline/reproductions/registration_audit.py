"""Which claims of docs/reproductions/claims.yaml were registered before their data (protocol v2).

    .venv/bin/python pipeline/reproductions/registration_audit.py [--json OUT]

For every behaviour: the oldest commit since which its current measurement design has stood in
claims.yaml (:func:`fedcomm.reporting.registration.first_registration`), the per-seed data files
its arms read (the ``curves`` globs, relative to docs/reproductions/, cut to the ``seeds`` pins
where the files are per-seed ``..._s<N>.csv``; ``minus`` sources included), the commit that
first added each, and a status:

- ``registered before its data``: the registration is a strict ancestor of every file's add;
- ``registered with or after its data``: some file came in with or before the registration;
- ``typed numbers``: an arm reads ``ablations:`` or ``per_seed:`` (no files to date);
- ``pending``: an arm has no data yet;
- ``design not committed`` / ``no data files``: the working copy's design is in no commit, or
  the globs match nothing.

Prints a table (id, registration, earliest data commit, status) and a count per status; with
``--json`` also writes every row (files and their add commits included) to OUT.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from fedcomm.reporting.registration import (
    data_files,
    first_added,
    first_registration,
    is_strict_ancestor,
    sources,
)

ROOT = Path(__file__).resolve().parents[2]
DOCS_REL = "docs/reproductions"
CLAIMS_REL = f"{DOCS_REL}/claims.yaml"
STATUSES = (
    "registered before its data",
    "registered with or after its data",
    "typed numbers",
    "pending",
    "design not committed",
    "no data files",
)


@cache
def commit_info(commit: str) -> tuple[str, str, int]:
    """(short hash, date, commit time) of a commit."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "show", "-s", "--format=%h %cs %ct", commit],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return out[0], out[1], int(out[2])


@cache
def age() -> dict[str, int]:
    """Each commit of HEAD's history by its place, oldest 0 (a topological order: an ancestor
    always comes first, whatever the clocks said)."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-list", "--topo-order", "--reverse", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return {c: i for i, c in enumerate(out)}


def audit(entry: Mapping[str, Any]) -> dict[str, Any]:
    srcs = [s for side in ("a", "b") for s in sources(entry.get(side))]
    files = data_files(entry, ROOT / DOCS_REL, DOCS_REL)
    reg = first_registration(ROOT, CLAIMS_REL, entry["id"], entry)
    added = {f: first_added(ROOT, f) for f in files}
    known = [c for c in added.values() if c is not None]
    earliest = min(known, key=lambda c: age()[c]) if known else None
    if any("pending" in s for s in srcs):
        status = "pending"
    elif any("ablations" in s or "per_seed" in s for s in srcs):
        status = "typed numbers"
    elif reg is None:
        status = "design not committed"
    elif not files:
        status = "no data files"
    elif all(c is not None and is_strict_ancestor(ROOT, reg, c) for c in added.values()):
        status = "registered before its data"
    else:
        status = "registered with or after its data"
    protocol = entry.get("protocol")
    return {
        "id": entry["id"],
        "registration": reg,
        "registration_date": commit_info(reg)[1] if reg else None,
        "declared": protocol.get("registered") if isinstance(protocol, Mapping) else None,
        "earliest_data": earliest,
        "earliest_data_date": commit_info(earliest)[1] if earliest else None,
        "files": {f: c for f, c in added.items()},
        "status": status,
    }


def _short(commit: str | None) -> str:
    if commit is None:
        return "–"
    short, date, _ = commit_info(commit)
    return f"{short} {date}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every row to this file")
    args = parser.parse_args(argv)
    doc = yaml.load((ROOT / CLAIMS_REL).read_text(), Loader=yaml.CSafeLoader)
    rows = [audit(entry) for entry in doc.get("behaviours") or ()]
    width = max(len(r["id"]) for r in rows)
    print(f"{'id':<{width}}  {'registration':<18}  {'earliest data':<18}  status")
    for r in rows:
        reg, data = _short(r["registration"]), _short(r["earliest_data"])
        print(f"{r['id']:<{width}}  {reg:<18}  {data:<18}  {r['status']}")
    counts = {s: [r["id"] for r in rows if r["status"] == s] for s in STATUSES}
    print()
    for status, ids in counts.items():
        if ids:
            print(f"{status}: {len(ids)}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "counts": counts}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
