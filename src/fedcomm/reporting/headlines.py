"""The headlines of the verdict pages: the count of counted behaviours and why the others are
not counted (:func:`headline`), each paper's headline method claims for the README
(:func:`headline_claims`) and for the paper's own page (:func:`paper_headline`)."""

from __future__ import annotations

from pathlib import Path

from fedcomm.reporting.cells import cell, difference_text, page_link
from fedcomm.reporting.claims import Decided, Registry
from fedcomm.reporting.papers import PAPERS
from fedcomm.reporting.verdict import (
    IN_DIRECTION,
    NOT_REPRODUCED,
    PENDING,
    REPRODUCED,
    TOO_FEW,
)


def headline(decided: list[Decided]) -> str:
    """ "N of M counted behaviours reproduced by the rule (K in direction, not significant; J
    not reproduced; P pending)", then how many rows are decided outside the headline and why."""
    counted = [d for d in decided if d.standing.counted]
    count = {v: sum(d.verdict == v for d in counted) for v in (REPRODUCED, IN_DIRECTION)}
    count |= {v: sum(d.verdict == v for d in counted) for v in (NOT_REPRODUCED, PENDING, TOO_FEW)}
    robust = sum(d.verdict == REPRODUCED and d.sensitivity.startswith("robust") for d in counted)
    text = (
        f"{count[REPRODUCED]} of {len(counted)} counted behaviours reproduced by the rule "
        f"({robust} of them robust; {count[IN_DIRECTION]} in direction, not significant; "
        f"{count[NOT_REPRODUCED]} not reproduced; {count[PENDING]} pending"
    )
    if count[TOO_FEW]:
        text += f"; {count[TOO_FEW]} with too few seeds"
    text += ")"
    rows = [d for d in decided if d.section == "behaviours" and not d.standing.counted]
    if rows:
        why: dict[str, int] = {}
        for d in rows:
            for reason in d.standing.reasons:
                why[reason] = why.get(reason, 0) + 1
        reasons = "; ".join(f"{r}: {n}" for r, n in why.items())
        are = "behaviour is" if len(rows) == 1 else "behaviours are"
        text += (
            f". {len(rows)} more {are} decided but not counted ({reasons}; "
            f"{sum(d.verdict == REPRODUCED for d in rows)} of them reproduced)"
        )
    diagnoses = sum(d.section == "diagnoses" for d in decided)
    if diagnoses:
        text += f"; {diagnoses} diagnoses have their own table"
    return text


def headline_claims(registry: Registry, decided: list[Decided], base: Path) -> str:
    """Per paper, its headline method claims (``headline: true``) and their verdicts."""
    lines = []
    for paper in PAPERS:
        rows = [d for d in decided if d.behaviour.paper == paper and d.behaviour.headline]
        if not rows:
            continue
        link = page_link(registry, rows[0].behaviour.page, base)
        items = []
        for d in rows:
            verdict = d.verdict if not d.waiting else f"pending, {d.waiting}"
            extra = [] if d.standing.counted else [d.standing.text()]
            if d.sensitivity:  # every decided verdict carries its mark, not only a pass
                extra.append(d.sensitivity.split(" (")[0])
            more = f" ({'; '.join(extra)})" if extra else ""
            items.append(f"{cell(d.behaviour.claim)}: **{verdict}**{more}")
        lines.append(f"- **[{paper}]({link})**: " + "; ".join(items) + ".")
    return "\n".join(lines)


def paper_headline(paper: str, registry: Registry, decided: list[Decided], base: Path) -> str:
    """A paper page's block: its headline method claims, each with its id, verdict, numbers,
    standing and sensitivity, then how many of the paper's behaviours the headline counts."""
    mine = [d for d in decided if d.behaviour.paper == paper and d.section == "behaviours"]
    link = page_link(registry, "README.md", base)
    lines = [
        f"**Headline method claims**, decided by the rule under protocol v2 ([all rows and the "
        f"rule]({link})):",
        "",
    ]
    for d in (d for d in mine if d.behaviour.headline):
        numbers = "" if d.paired is None else f"; {difference_text(d.paired)}"
        extra = [] if d.standing.counted else [d.standing.text()]
        if d.sensitivity:
            extra.append(d.sensitivity)
        more = f" ({'; '.join(extra)})" if extra else ""
        verdict = d.verdict if not d.waiting else f"pending, {d.waiting}"
        lines.append(
            f"- {cell(d.behaviour.claim)} (`{d.behaviour.id}`{numbers}): **{verdict}**{more}"
        )
    counted = [d for d in mine if d.standing.counted]
    done = sum(d.verdict == REPRODUCED for d in counted)
    lines += [
        "",
        f"Of this paper's {len(mine)} behaviours, {len(counted)} "
        f"{'is' if len(counted) == 1 else 'are'} counted in the headline "
        f"({done} reproduced); the others were registered after their data or rest on typed "
        "per-seed numbers.",
    ]
    return "\n".join(lines)
