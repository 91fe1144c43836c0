"""Pre-registration of claims (protocol v2): a claim's measurement design must be committed
BEFORE the data it is decided from.

A behaviour of ``claims.yaml`` names ``protocol.registered: <commit>`` (or ``after-data`` for an
honest post-hoc claim). :func:`check_registration` verifies it from git alone: the commit holds
the entry with the same measurement design (:func:`design`, :func:`same_design`) as now, and
every data file the claim reads was first added in a strict descendant of that commit.
:func:`first_registration` finds the oldest commit since which the current design has stood.

Everything here is plain ``git -C <root> ...``; the design is read from the raw YAML mapping (not
the validated schema), so an old commit's file that the current schema would refuse still reads.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from fedcomm.reporting.git_history import (
    FULL_HASH,
    RegistrationError,
    first_added,
    git,
    head,
    is_strict_ancestor,
    log,
    require_repo,
    resolve,
    yaml_at,
)

__all__ = [
    "AFTER_DATA",
    "RegistrationError",
    "check_registration",
    "data_files",
    "design",
    "design_diff",
    "entry_at",
    "first_added",
    "first_registration",
    "is_strict_ancestor",
    "repo_top",
    "same_design",
    "sources",
]

AFTER_DATA = "after-data"
ARM_KEYS = ("run", "within_gib", "axis", "at_round", "ended_inside")
PROTOCOL_KEYS = ("n", "looks", "spending", "measure", "cap_gib", "axis", "at_round", "chosen_among")
#: The protocol key that may be added (or raised) after the registration: it only raises the
#: threshold (``protocol.Protocol.chosen_among``: a choice made on the claim's own data, paid for).
STRICTER_ONLY = "protocol.chosen_among"
SECTIONS = ("behaviours", "diagnoses")
DEFAULT_AXIS = "up_down"

Design = dict[str, Any]


# ------------------------------------------------------------------------------- the design


def _arm_design(arm: Any, prefix: str, out: Design) -> None:
    arm = arm if isinstance(arm, Mapping) else {}
    for key in ARM_KEYS:
        out[f"{prefix}.{key}"] = arm.get(key)
    if arm.get("within_gib") is not None and arm.get("axis") is None:
        out[f"{prefix}.axis"] = DEFAULT_AXIS
    minus = arm.get("minus")
    out[f"{prefix}.minus"] = minus is not None
    if minus is not None:
        _arm_design(minus, f"{prefix}.minus", out)


OLD_CAP_METRIC = re.compile(r"^best_within_([0-9.]+)_gib$")


def _unversioned(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    """An entry written in the registry's first form, ``metric: best_within_0.5_gib``, as the
    same measurement in today's form (``global_accuracy`` with ``within_gib: 0.5`` on each arm,
    the upload + download axis): a rewrite of the words, not of the design."""
    match = OLD_CAP_METRIC.match(str(entry.get("metric")))
    if match is None:
        return entry
    cap = float(match.group(1))
    arms = {
        side: {**arm, "within_gib": cap} if isinstance(arm, Mapping) else arm
        for side in ("a", "b")
        if (arm := entry.get(side)) is not None
    }
    return {**entry, "metric": "global_accuracy", **arms}


def _pending_capped(entry: Mapping[str, Any]) -> Mapping[str, Any]:
    """A pending arm (no data yet) measures what the protocol block states: under
    ``measure: best_within_cap`` it reads as ``within_gib: cap_gib`` on ``axis``, so a claim
    registered with pending arms keeps its design when the arms get their curves."""
    protocol = entry.get("protocol")
    if not isinstance(protocol, Mapping) or protocol.get("measure") != "best_within_cap":
        return entry
    cap = {"within_gib": protocol.get("cap_gib"), "axis": protocol.get("axis") or DEFAULT_AXIS}
    arms = {
        side: {**arm, **cap}
        for side in ("a", "b")
        if isinstance(arm := entry.get(side), Mapping) and arm.get("pending") is not None
    }
    return {**entry, **arms}


def design(entry: Mapping[str, Any]) -> Design:
    """The measurement design of a raw behaviour entry, as a flat ``{dotted key: value}``:
    metric, direction, margin, scale, per arm (``a.``, ``b.``, ``a.minus.``...) run, within_gib,
    axis, at_round, ended_inside and whether a ``minus`` exists, and ``protocol.<key>`` for the
    protocol block's n, looks, spending, measure, cap_gib, axis, at_round when given. Labels,
    notes, setting, claim text, paper_value, ``seeds`` pins, the curves glob and settled_by are
    not part of it. The registry's first form of a capped metric reads as today's
    (:func:`_unversioned`), and a pending arm as what the protocol states
    (:func:`_pending_capped`)."""
    entry = _pending_capped(_unversioned(entry))
    out: Design = {
        "metric": entry.get("metric"),
        "direction": entry.get("direction"),
        "margin": 0.0 if entry.get("margin") is None else entry["margin"],
        "scale": 1.0 if entry.get("scale") is None else entry["scale"],
    }
    for side in ("a", "b"):
        _arm_design(entry.get(side), side, out)
    protocol = entry.get("protocol")
    if isinstance(protocol, Mapping):
        # an unstated key of a v2 block reads as its default (what it measured then)
        stated = {"spending": "pocock", "chosen_among": 1, **protocol}
        if stated.get("measure") == "best_within_cap" and stated.get("axis") is None:
            stated["axis"] = DEFAULT_AXIS
        for key in PROTOCOL_KEYS:
            if stated.get(key) is not None:
                out[f"protocol.{key}"] = stated[key]
    return out


def _may_fill(key: str, old: Design) -> bool:
    """Keys that a registration may leave open: an arm's run (a pending arm had none yet), the
    protocol block of an entry registered before protocol v2 (it had none: every key of it is
    filled in), and ``chosen_among`` (it only raises the threshold). A protocol key absent from
    a v2 registration (one with a protocol block) may not be added later: n, looks, spending,
    measure, cap and round are fixed before the data."""
    if key == STRICTER_ONLY:
        return True
    if key.startswith("protocol."):
        return not any(k.startswith("protocol.") for k in old)
    return key == "run" or key.endswith(".run")


def design_diff(old: Design, new: Design) -> list[str]:
    """The keys on which ``new`` departs from the registered ``old`` (see :func:`same_design`)."""
    diff = []
    for key in sorted(set(old) | set(new)):
        was, now = old.get(key), new.get(key)
        if was is None and _may_fill(key, old):
            continue
        if key == STRICTER_ONLY and _at_least(now, was):
            continue
        if was != now:
            diff.append(key)
    return diff


def _at_least(now: Any, was: Any) -> bool:
    try:
        return int(now) >= int(was)
    except (TypeError, ValueError):
        return False


def same_design(old: Design, new: Design) -> bool:
    """Whether ``new`` keeps the design registered as ``old``: equal, except that a run absent
    (or None) in ``old`` accepts any value in ``new``, so does the whole protocol block of an
    entry registered before protocol v2, and ``chosen_among`` may be added or raised."""
    return not design_diff(old, new)


def entry_at(
    root: Path | str, commit: str, claims_rel: str, entry_id: str
) -> Mapping[str, Any] | None:
    """The raw entry ``entry_id`` of ``claims_rel`` (``behaviours`` or ``diagnoses``) as of
    ``commit``; None when the file or the entry is not there."""
    full = commit if FULL_HASH.fullmatch(commit) else resolve(root, commit)
    doc = yaml_at(str(root), full, claims_rel) if full else None
    if not isinstance(doc, Mapping):
        return None
    for section in SECTIONS:
        for item in doc.get(section) or ():
            if isinstance(item, Mapping) and item.get("id") == entry_id:
                return item
    return None


# ----------------------------------------------------------------------------- the checks


PER_SEED = re.compile(r"_s(\d+)\.csv$")


def sources(arm: Mapping[str, Any] | None) -> Iterator[Mapping[str, Any]]:
    """An arm's source and, recursively, its ``minus`` sources."""
    while isinstance(arm, Mapping):
        yield arm
        arm = arm.get("minus")


def data_files(entry: Mapping[str, Any], folder: Path, prefix: str) -> list[str]:
    """The files a raw entry's ``curves`` sources read (both arms, ``minus`` included), as
    ``prefix/<path relative to folder>``: each glob relative to ``folder`` (the claims file's),
    cut to the ``seeds`` pins where a file is per-seed (``..._s<N>.csv``)."""
    files = set()
    for side in ("a", "b"):
        for source in sources(entry.get(side)):
            pattern, seeds = source.get("curves"), source.get("seeds")
            if not pattern:
                continue
            for rel in sorted(glob.glob(pattern, root_dir=folder)):
                match = PER_SEED.search(rel)
                if seeds is not None and match and int(match.group(1)) not in seeds:
                    continue
                files.add(f"{prefix}/{rel}" if prefix else rel)
    return sorted(files)


def repo_top(folder: Path) -> Path:
    """The top of the git repository holding ``folder`` (:class:`RegistrationError` if none)."""
    require_repo(folder)
    return Path(git(folder, "rev-parse", "--show-toplevel").stdout.strip())


def check_registration(
    root: Path,
    claims_rel: str,
    entry_id: str,
    registered: str,
    current_entry: Mapping[str, Any],
    data_files: list[str],
) -> list[str]:
    """What is wrong with ``protocol.registered: <registered>`` for ``entry_id`` (empty: it
    holds). ``claims_rel`` and ``data_files`` are relative to ``root`` (the repository's top).
    ``after-data`` declares no registration, so there is nothing to check against."""
    require_repo(root)
    if registered == AFTER_DATA:
        return []
    commit = resolve(root, registered)
    if commit is None:
        return [f"{entry_id}: registered commit {registered} does not exist"]
    short = commit[:12]
    problems = []
    old = entry_at(root, commit, claims_rel, entry_id)
    if old is None:
        problems.append(f"{entry_id}: {claims_rel} at {short} has no behaviour {entry_id}")
    else:
        diff = design_diff(design(old), design(current_entry))
        if diff:
            problems.append(f"{entry_id}: the design changed since {short}: {', '.join(diff)}")
        problems += _chosen_among_lowered(root, claims_rel, entry_id, commit, current_entry)
    for rel in data_files:
        added = first_added(root, rel)
        if added is None:
            problems.append(f"{entry_id}: data file {rel} is not committed")
        elif not is_strict_ancestor(root, commit, added):
            problems.append(
                f"{entry_id}: data file {rel} was added in {added[:12]}, not after the "
                f"registration {short}"
            )
    return problems


def _chosen_among(entry: Mapping[str, Any] | None) -> int:
    """An entry's ``protocol.chosen_among`` as an int (1 when unstated or unreadable)."""
    protocol = entry.get("protocol") if isinstance(entry, Mapping) else None
    try:
        return int(protocol.get("chosen_among") or 1) if isinstance(protocol, Mapping) else 1
    except (TypeError, ValueError):
        return 1


def _chosen_among_lowered(
    root: Path, claims_rel: str, entry_id: str, registered: str, current: Mapping[str, Any]
) -> list[str]:
    """``chosen_among`` may be raised after the registration, never lowered: the current value
    must be at least the largest any commit since the registration gave it (a choice paid for
    once stays paid for)."""
    now = _chosen_among(current)
    since = log(str(root), head(root), "--format=%H", f"{registered}..HEAD", "--", claims_rel)
    worst, where = now, ""
    for commit in since:
        was = _chosen_among(entry_at(root, commit, claims_rel, entry_id))
        if was > worst:
            worst, where = was, commit[:12]
    if worst > now:
        return [
            f"{entry_id}: protocol.chosen_among is {now}, but commit {where} had {worst}: "
            "a choice paid for may not be unpaid"
        ]
    return []


def first_registration(
    root: Path | str, claims_rel: str, entry_id: str, current_entry: Mapping[str, Any]
) -> str | None:
    """The oldest commit C touching ``claims_rel`` such that at C and at every later commit
    touching it the entry holds the current design; None when the newest one does not."""
    require_repo(root)
    now = design(current_entry)
    found = None
    for commit in log(str(root), head(root), "--format=%H", "--", claims_rel):
        old = entry_at(root, commit, claims_rel, entry_id)
        if old is None or not same_design(design(old), now):
            break
        found = commit
    return found
