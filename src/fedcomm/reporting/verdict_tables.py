"""The claims registry as markdown: the behaviours table with its headline, the checks table,
the table of claims not tested here, and the marked blocks of a page they fill
(``fedcomm verdicts --write/--check``).

A page carries ``<!-- verdicts:begin -->`` … ``<!-- verdicts:end -->`` (the headline, each
paper's headline method claims and the behaviours table), ``<!-- checks:begin -->`` …
``<!-- checks:end -->`` (the checks table) and, when the registry has them, ``<!--
diagnoses:begin -->`` … (the diagnoses table) and ``<!-- untested:begin -->`` …; everything
outside the markers is left as it is. Another page (the project's README) may carry only
``<!-- headline:begin -->`` … ``<!-- headline:end -->``: the headline and the papers' headline
method claims.
"""

from __future__ import annotations

import difflib
from pathlib import Path

from fedcomm.errors import InputError
from fedcomm.reporting.cells import cell, difference_text, page_link
from fedcomm.reporting.claims import Decided, Registry
from fedcomm.reporting.headlines import headline, headline_claims, paper_headline
from fedcomm.reporting.paper_tables import fill_tables, table_blocks
from fedcomm.reporting.papers import PAPERS
from fedcomm.reporting.verdict import (
    IN_DIRECTION,
    REPRODUCED,
    TOO_FEW,
)

MARKERS = {
    "verdicts": ("<!-- verdicts:begin -->", "<!-- verdicts:end -->"),
    "checks": ("<!-- checks:begin -->", "<!-- checks:end -->"),
    "diagnoses": ("<!-- diagnoses:begin -->", "<!-- diagnoses:end -->"),
    "untested": ("<!-- untested:begin -->", "<!-- untested:end -->"),
}


def verdict_text(dec: Decided) -> str:
    """The verdict, what decided it and which "final" was used (and, for a row outside the
    headline, why)."""
    p = dec.paired
    tail = "" if dec.standing.counted else f"; *{dec.standing.text()}*"
    if p is None:
        what = " ".join(s.pending for s in (dec.behaviour.a, dec.behaviour.b) if s.pending)
        return (f"**pending**: {what}" if what else "**pending**") + tail
    final = f"final = {dec.final}"
    if dec.waiting:
        return f"**pending** ({dec.waiting}; {final}){tail}"
    if p.verdict == TOO_FEW:
        return f"**too few seeds** (n = {p.n} < 3); {final}{tail}"
    side = ">" if p.direction == "greater" else "<"
    crit = "" if p.t_crit is None else f"{'' if side == '>' else '−'}{p.t_crit:.3f}"
    if dec.behaviour.protocol.looks:
        looks = dec.behaviour.protocol.looks
        crit += f", the bound of look {looks.index(p.n) + 1} of {len(looks)}"
    if p.verdict == REPRODUCED:
        why = f"t {side} {crit}" if p.se else f"SE 0, every d {side} {p.margin:g}"
    elif p.verdict == IN_DIRECTION:
        why = f"t short of {crit}"
    else:
        why = f"d {'≤' if side == '>' else '≥'} {p.margin:g}"
    return f"**{p.verdict}** ({why}; {final}){tail}"


def design_text(dec: Decided) -> str:
    """The claim's registered design: n (or its looks), measure, cap, registration."""
    pr = dec.behaviour.protocol
    n = f"n {pr.n}" if not pr.looks else f"looks {'/'.join(map(str, pr.looks))} ({pr.spending})"
    if pr.measure == "best_within_cap":
        measure = f"best within {pr.cap_gib:g} GiB ({pr.axis})"
    elif pr.measure == "at_round":
        measure = f"at round {'/'.join(map(str, pr.at_round or ()))}"
    else:
        measure = "final"
    reg = "after its data" if pr.after_data else f"registered {pr.registered[:7]}"
    paid = f"; chosen among {pr.chosen_among} (alpha / {pr.chosen_among})" * (pr.chosen_among > 1)
    return f"{n}; {measure}{paid}; {reg}"


def behaviours_table(
    registry: Registry, decided: list[Decided], base: Path, section: str = "behaviours"
) -> str:
    """The markdown table of one section's rows; links to pages are relative to ``base``."""
    rows = [
        "| Paper | Claim | Paper's number | fedcomm: a vs b, n, paired difference mean ± SE, "
        "t (df) | Verdict | Design | Sensitivity | Note |",
        "|---|---|---:|---|---|---|---|---|",
    ]
    for dec in (d for d in decided if d.section == section):
        beh = dec.behaviour
        link = page_link(registry, beh.page, base)
        arms = f"{beh.a.label} vs {beh.b.label}"
        if dec.paired is None:
            olds = [f"{s.label}: {s.old}" for s in (beh.a, beh.b) if s.old]
            numbers = f"{arms}: no per-seed data" + (f" (old: {'; '.join(olds)})" if olds else "")
        else:
            numbers = f"{arms}, {difference_text(dec.paired)}"
        claim = f"{cell(beh.claim)}<br>*{cell(beh.setting)}*"
        note = beh.note + (f" Settled by {beh.settled_by}." if beh.settled_by else "")
        rows.append(
            f"| [{beh.paper}]({link}) | {claim} | {cell(beh.paper_value)} | {cell(numbers)} "
            f"| {verdict_text(dec)} | {cell(design_text(dec))} | {cell(dec.sensitivity or '–')} "
            f"| {cell(note)} |"
        )
    return "\n".join(rows)


def _table(header: str, rule: str, rows: list[list[str]]) -> str:
    """A markdown table: the header and rule lines, then one line per row of cells."""
    return "\n".join([header, rule, *("| " + " | ".join(cells) + " |" for cells in rows)])


def checks_table(registry: Registry, base: Path) -> str:
    """The markdown table of the checks (counts and calibrated numbers)."""
    rows = [
        [
            f"[{c.paper}]({page_link(registry, c.page, base)})",
            cell(c.what),
            c.kind,
            cell(c.paper_value),
            cell(c.fedcomm_value),
            "yes" if c.agrees else "**no**",
            cell(c.note + (f" Settled by {c.settled_by}." if c.settled_by else "")),
        ]
        for c in registry.checks
    ]
    header = "| Paper | Check | Kind | Paper's number | fedcomm | Agrees | Note |"
    return _table(header, "|---|---|---|---:|---:|---|---|", rows)


def untested_table(registry: Registry, base: Path) -> str:
    """The markdown table of the claims that cannot be tested here, with what would test them."""
    rows = [
        [
            f"[{u.paper}]({page_link(registry, u.page, base)})",
            f"{cell(u.claim)}<br>*{cell(u.setting)}*",
            cell(u.paper_value),
            cell(u.needs),
            cell(u.note),
        ]
        for u in registry.untested
    ]
    header = "| Paper | Claim | Paper's number | What would test it | Note |"
    return _table(header, "|---|---|---:|---|---|", rows)


def blocks(registry: Registry, decided: list[Decided], base: Path) -> dict[str, str]:
    """The text of each marked block: ``{"verdicts": headline + the papers' headline claims +
    table, "checks": table, "diagnoses": table, "untested": table, "headline": headline +
    claims}`` (``""`` for a section the registry does not have)."""
    head = f"{headline(decided)}."
    n = len(registry.untested)
    if n:
        head += (
            f" {n} {'claim is' if n == 1 else 'claims are'} not tested here (no data or "
            "accelerator on this machine; not counted, listed under the checks)."
        )
    claims = headline_claims(registry, decided, base)
    top = f"{head}\n\nThe papers' headline method claims:\n\n{claims}" if claims else head
    return {
        "verdicts": f"{top}\n\n{behaviours_table(registry, decided, base)}",
        "checks": checks_table(registry, base),
        "diagnoses": behaviours_table(registry, decided, base, "diagnoses")
        if registry.diagnoses
        else "",
        "untested": untested_table(registry, base) if n else "",
        "headline": top,
        **{f"headline:{p}": paper_headline(p, registry, decided, base) for p in PAPERS},
        **table_blocks(registry),
    }


def _replace(text: str, begin: str, end: str, content: str) -> str:
    i, j = text.find(begin), text.find(end)
    return text[: i + len(begin)] + "\n" + content + "\n" + text[j:]


def _headline_markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def fill(text: str, contents: dict[str, str], name: Path) -> str:
    """``text`` with the content between each pair of markers replaced; :class:`InputError`
    naming the missing markers of file ``name`` if any is absent (or out of order). A block with
    no content needs no markers; where it has them, it is emptied. A page without the tables'
    markers gets its headline blocks alone: ``headline`` (all papers) and ``headline:<Paper>``
    (a paper page's headline method claims). Any page may hold ``table:<id>`` blocks (a paper's
    table beside fedcomm's numbers, :mod:`.paper_tables`); each one it holds is refilled."""
    text, tables = fill_tables(text, contents, name)
    if all(m not in text for m in MARKERS["verdicts"]):
        found = False
        for block in ("headline", *(f"headline:{p}" for p in PAPERS)):
            begin, end = _headline_markers(block)
            if begin not in text and end not in text:
                continue
            if text.find(end) < text.find(begin):
                raise InputError(f"{name}: marker {begin} must come before {end}")
            text, found = _replace(text, begin, end, contents[block]), True
        if found or tables:
            return text
    missing = []
    for block, (begin, end) in MARKERS.items():
        i, j = text.find(begin), text.find(end)
        if i < 0 and j < 0 and not contents.get(block):
            continue  # an empty block needs no markers
        if i < 0 or j < i:
            missing += [m for m in (begin, end) if m not in text] or [f"{begin} before {end}"]
            continue
        text = _replace(text, begin, end, contents[block])
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
