"""The claims registry as markdown: the behaviours table with its headline, the checks table,
the table of claims not tested here, and the marked blocks of a page they fill
(``fedcomm verdicts --write/--check``).

A page carries ``<!-- verdicts:begin -->`` … ``<!-- verdicts:end -->`` (the headline and the
behaviours table), ``<!-- checks:begin -->`` … ``<!-- checks:end -->`` (the checks table) and,
when the registry has ``untested`` claims, ``<!-- untested:begin -->`` … ``<!-- untested:end
-->``; everything outside the markers is left as it is.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from fedcomm.errors import InputError
from fedcomm.reporting.claims import Decided, Registry
from fedcomm.reporting.verdict import (
    IN_DIRECTION,
    NOT_REPRODUCED,
    PENDING,
    REPRODUCED,
    TOO_FEW,
    Paired,
    shown_decimals,
    t_text,
)

MARKERS = {
    "verdicts": ("<!-- verdicts:begin -->", "<!-- verdicts:end -->"),
    "checks": ("<!-- checks:begin -->", "<!-- checks:end -->"),
    "untested": ("<!-- untested:begin -->", "<!-- untested:end -->"),
}


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell (no pipes, no line breaks)."""
    return " ".join(text.split()).replace("|", "\\|")


def difference_text(p: Paired) -> str:
    """``n = 3: d = +0.21 ± 0.05, t = 4.20 (2 df)``, in shown units, with the margin when it is not
    0 (``t = +∞`` when SE is 0)."""
    if p.mean is None:
        return f"n = {p.n}"
    places = shown_decimals(p.se, p.mean)
    text = f"n = {p.n}: d = {p.mean:+.{places}f}"
    if p.se is None:
        return text
    text += f" ± {p.se:.{places}f}"
    if p.margin:
        text += f" (margin {p.margin:+g})"
    if p.t is None:
        return text + ", t undefined (every d on the margin)"
    return f"{text}, t = {t_text(p.t)} ({p.df} df)"


def verdict_text(dec: Decided) -> str:
    """The verdict, what decided it and which "final" was used."""
    p = dec.paired
    if p is None:
        what = " ".join(s.pending for s in (dec.behaviour.a, dec.behaviour.b) if s.pending)
        return f"**pending**: {what}" if what else "**pending**"
    final = f"final = {dec.final}"
    if p.verdict == TOO_FEW:
        return f"**too few seeds** (n = {p.n} < 3); {final}"
    side = ">" if p.direction == "greater" else "<"
    crit = "" if p.t_crit is None else f"{'' if side == '>' else '−'}{p.t_crit:.3f}"
    if p.verdict == REPRODUCED:
        why = f"t {side} {crit}" if p.se else f"SE 0, every d {side} {p.margin:g}"
    elif p.verdict == IN_DIRECTION:
        why = f"t short of {crit}"
    else:
        why = f"d {'≤' if side == '>' else '≥'} {p.margin:g}"
    return f"**{p.verdict}** ({why}; {final})"


def _page_link(registry: Registry, page: str, base: Path) -> str:
    return os.path.relpath(registry.root / page, base).replace(os.sep, "/")


def behaviours_table(registry: Registry, decided: list[Decided], base: Path) -> str:
    """The markdown table of the behaviours; links to pages are relative to folder ``base``."""
    rows = [
        "| Paper | Claim | Paper's number | fedcomm: a vs b, n, paired difference mean ± SE, "
        "t (df) | Verdict | Note |",
        "|---|---|---:|---|---|---|",
    ]
    for dec in decided:
        beh = dec.behaviour
        link = _page_link(registry, beh.page, base)
        arms = f"{beh.a.label} vs {beh.b.label}"
        if dec.paired is None:
            olds = [f"{s.label}: {s.old}" for s in (beh.a, beh.b) if s.old]
            numbers = f"{arms}: no per-seed data" + (f" (old: {'; '.join(olds)})" if olds else "")
        else:
            numbers = f"{arms}, {difference_text(dec.paired)}"
        claim = f"{_cell(beh.claim)}<br>*{_cell(beh.setting)}*"
        note = beh.note + (f" Settled by {beh.settled_by}." if beh.settled_by else "")
        rows.append(
            f"| [{beh.paper}]({link}) | {claim} | {_cell(beh.paper_value)} | {_cell(numbers)} "
            f"| {verdict_text(dec)} | {_cell(note)} |"
        )
    return "\n".join(rows)


def headline(decided: list[Decided]) -> str:
    """ "N of M behaviours reproduced by the rule (K in direction, not significant; J not
    reproduced; P pending)" (and the ones with too few seeds, when there are any)."""
    count = {v: sum(d.verdict == v for d in decided) for v in (REPRODUCED, IN_DIRECTION)}
    count |= {v: sum(d.verdict == v for d in decided) for v in (NOT_REPRODUCED, PENDING, TOO_FEW)}
    text = (
        f"{count[REPRODUCED]} of {len(decided)} behaviours reproduced by the rule "
        f"({count[IN_DIRECTION]} in direction, not significant; "
        f"{count[NOT_REPRODUCED]} not reproduced; {count[PENDING]} pending"
    )
    if count[TOO_FEW]:
        text += f"; {count[TOO_FEW]} with too few seeds"
    return text + ")"


def _table(header: str, rule: str, rows: list[list[str]]) -> str:
    """A markdown table: the header and rule lines, then one line per row of cells."""
    return "\n".join([header, rule, *("| " + " | ".join(cells) + " |" for cells in rows)])


def checks_table(registry: Registry, base: Path) -> str:
    """The markdown table of the checks (counts and calibrated numbers)."""
    rows = [
        [
            f"[{c.paper}]({_page_link(registry, c.page, base)})",
            _cell(c.what),
            c.kind,
            _cell(c.paper_value),
            _cell(c.fedcomm_value),
            "yes" if c.agrees else "**no**",
            _cell(c.note + (f" Settled by {c.settled_by}." if c.settled_by else "")),
        ]
        for c in registry.checks
    ]
    header = "| Paper | Check | Kind | Paper's number | fedcomm | Agrees | Note |"
    return _table(header, "|---|---|---|---:|---:|---|---|", rows)


def untested_table(registry: Registry, base: Path) -> str:
    """The markdown table of the claims that cannot be tested here, with what would test them."""
    rows = [
        [
            f"[{u.paper}]({_page_link(registry, u.page, base)})",
            f"{_cell(u.claim)}<br>*{_cell(u.setting)}*",
            _cell(u.paper_value),
            _cell(u.needs),
            _cell(u.note),
        ]
        for u in registry.untested
    ]
    header = "| Paper | Claim | Paper's number | What would test it | Note |"
    return _table(header, "|---|---|---:|---|---|", rows)


def blocks(registry: Registry, decided: list[Decided], base: Path) -> dict[str, str]:
    """The text of each marked block: ``{"verdicts": headline + table, "checks": table,
    "untested": table}`` (``""`` when the registry has no untested claims)."""
    head = f"{headline(decided)}."
    n = len(registry.untested)
    if n:
        head += (
            f" {n} {'claim is' if n == 1 else 'claims are'} not tested here (no data or "
            "accelerator on this machine; not counted, listed under the checks)."
        )
    return {
        "verdicts": f"{head}\n\n{behaviours_table(registry, decided, base)}",
        "checks": checks_table(registry, base),
        "untested": untested_table(registry, base) if n else "",
    }


def fill(text: str, contents: dict[str, str], name: Path) -> str:
    """``text`` with the content between each pair of markers replaced; :class:`InputError`
    naming the missing markers of file ``name`` if any is absent (or out of order). A block with
    no content (no untested claims) needs no markers; where it has them, it is emptied."""
    missing = []
    for block, (begin, end) in MARKERS.items():
        i, j = text.find(begin), text.find(end)
        if i < 0 and j < 0 and not contents.get(block):
            continue  # an empty block needs no markers
        if i < 0 or j < i:
            missing += [m for m in (begin, end) if m not in text] or [f"{begin} before {end}"]
            continue
        text = text[: i + len(begin)] + "\n" + contents[block] + "\n" + text[j:]
    if missing:
        raise InputError(f"{name}: missing marker(s) {', '.join(missing)}")
    return text


def diff(old: str, new: str, name: Path) -> str:
    """A unified diff of a page's current text against what the claims give."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"{name} (as committed)",
        tofile=f"{name} (from the claims)",
    )
    return "".join(lines)
