"""docs/reproductions/: the README's verdict tables are what claims.yaml gives, every claim has a
computed verdict, counts stay out of the headline, and no page states a verdict of its own.

These read the committed files (no runs): a hand edit of a verdict in the README or a page, a
behaviour left out of a table, or a stale table after claims.yaml changed fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.reporting.claims import Decided, Registry, decide, load_registry
from fedcomm.reporting.verdict import IN_DIRECTION, NOT_REPRODUCED, PENDING, REPRODUCED, TOO_FEW
from fedcomm.reporting.verdict_tables import MARKERS, PAPERS

DOCS = Path(__file__).resolve().parents[3] / "docs" / "reproductions"
CLAIMS = DOCS / "claims.yaml"
README = DOCS / "README.md"
VERDICTS = (REPRODUCED, IN_DIRECTION, NOT_REPRODUCED, PENDING, TOO_FEW)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return load_registry(CLAIMS)


@pytest.fixture(scope="module")
def decided(registry: Registry) -> list[Decided]:
    return decide(registry)


def _block(text: str, name: str) -> str:
    begin, end = MARKERS[name]
    assert text.count(begin) == 1 and text.count(end) == 1, f"README needs one {begin} … {end}"
    return text[text.index(begin) + len(begin) : text.index(end)]


def _rows(block: str) -> list[str]:
    """The body rows of the one markdown table in ``block`` (header and rule dropped)."""
    rows = [line for line in block.splitlines() if line.startswith("| ")]
    return rows[1:]


def _bold_verdicts(line: str) -> list[str]:
    return [v for v in VERDICTS if f"**{v}**" in line]


PAGES = [README, DOCS.parents[1] / "README.md", *(DOCS / f"{p.lower()}.md" for p in PAPERS)]


def test_readme_tables_are_what_the_claims_give() -> None:
    """The README's tables, the project README's headline and each paper page's headline
    method claims are what the claims give."""
    args = ["verdicts", str(CLAIMS)] + [x for page in PAGES for x in ("--check", str(page))]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (
        "a page is stale: run the `fedcomm verdicts ... --write` line of the README's "
        f"Reproductions section\n{result.output}"
    )


def test_each_paper_page_opens_with_its_headline_claims() -> None:
    for paper in PAPERS:
        text = (DOCS / f"{paper.lower()}.md").read_text(encoding="utf-8")
        begin = f"<!-- headline:{paper}:begin -->"
        assert text.index(begin) < 200, f"{paper}'s page must open with its headline claims"
        assert "**Calibrated" in text[: text.index("<!-- headline") + 4000], paper


@pytest.mark.parametrize("section", ["behaviours", "diagnoses"])
def test_every_behaviour_has_one_computed_verdict(
    registry: Registry, decided: list[Decided], section: str
) -> None:
    block = "verdicts" if section == "behaviours" else "diagnoses"
    rows = _rows(_block(README.read_text(encoding="utf-8"), block))
    mine = [d for d in decided if d.section == section]
    assert len(rows) == len(getattr(registry, section)) == len(mine) > 0
    for row, dec in zip(rows, mine, strict=True):
        assert " ".join(dec.behaviour.claim.split()) in row, (dec.behaviour.id, row)
        assert _bold_verdicts(row) == [dec.verdict], (dec.behaviour.id, row)
        assert dec.standing.counted or "outside the headline" in row, dec.behaviour.id


def test_every_check_is_in_the_checks_table_and_only_there(registry: Registry) -> None:
    text = README.read_text(encoding="utf-8")
    rows = _rows(_block(text, "checks"))
    assert len(rows) == len(registry.checks) > 0
    for row, check in zip(rows, registry.checks, strict=True):
        assert " ".join(check.what.split()) in row.replace("\\|", "|"), (check.id, row)
        assert f"| {check.kind} |" in row
    behaviour_rows = "\n".join(_rows(_block(text, "verdicts")))
    for check in registry.checks:
        assert " ".join(check.what.split()) not in behaviour_rows, check.id


def test_untested_claims_are_in_their_table_only(registry: Registry) -> None:
    """A claim this machine cannot test is listed with what would test it, never in the
    behaviours table (so never counted), and its page names it without a verdict."""
    text = README.read_text(encoding="utf-8")
    rows = _rows(_block(text, "untested"))
    assert len(rows) == len(registry.untested)
    behaviour_rows = "\n".join(_rows(_block(text, "verdicts")))
    for row, claim in zip(rows, registry.untested, strict=True):
        assert " ".join(claim.claim.split()) in row and _bold_verdicts(row) == [], claim.id
        assert " ".join(claim.claim.split()) not in behaviour_rows, claim.id
        page = (DOCS / claim.page).read_text(encoding="utf-8")
        lines = [line for line in page.splitlines() if f"`{claim.id}`" in line]
        assert lines and all(_bold_verdicts(line) == [] for line in lines), claim.id


def test_headline_counts_counted_behaviours_only(
    registry: Registry, decided: list[Decided]
) -> None:
    """The headline counts behaviours registered before their data and decided from curves:
    not checks, not diagnoses, not rows registered after their data or typed by hand."""
    block = _block(README.read_text(encoding="utf-8"), "verdicts")
    found = re.search(
        r"(\d+) of (\d+) counted behaviours reproduced by the rule \((\d+) of them robust; "
        r"(\d+) in direction, not significant; (\d+) not reproduced; (\d+) pending",
        block,
    )
    assert found, "the headline line is missing"
    reproduced, total, robust, in_direction, not_reproduced, pending = map(int, found.groups())
    counted = [d for d in decided if d.standing.counted]
    assert all(d.section == "behaviours" for d in counted)
    assert all(not d.behaviour.protocol.after_data for d in counted)
    assert registry.checks and registry.diagnoses and total == len(counted) > 0
    count = {v: sum(d.verdict == v for d in counted) for v in VERDICTS}
    assert (reproduced, in_direction, not_reproduced, pending) == (
        count[REPRODUCED],
        count[IN_DIRECTION],
        count[NOT_REPRODUCED],
        count[PENDING],
    )
    assert reproduced + in_direction + not_reproduced + pending + count[TOO_FEW] == total
    assert robust <= reproduced


def test_each_paper_lists_its_headline_method_claims(
    registry: Registry, decided: list[Decided]
) -> None:
    block = _block(README.read_text(encoding="utf-8"), "verdicts")
    for paper in ("FedBIAD", "FedSparse", "FedDST", "ProgFed"):
        heads = [d for d in decided if d.behaviour.paper == paper and d.behaviour.headline]
        assert heads, f"{paper} has no headline method claim"
        line = next(x for x in block.splitlines() if x.startswith(f"- **[{paper}]"))
        for dec in heads:
            assert f"{' '.join(dec.behaviour.claim.split())}: **{dec.verdict}" in line


def test_each_page_states_the_computed_verdict_or_none(
    registry: Registry, decided: list[Decided]
) -> None:
    """Every behaviour appears on its page by id, on a line whose only bold verdict is the
    computed one; every check appears on its page by id."""
    names = {b.page for b in (*registry.behaviours, *registry.diagnoses)}
    names |= {c.page for c in registry.checks}
    pages = {page: (DOCS / page).read_text(encoding="utf-8") for page in names}
    for dec in decided:
        beh = dec.behaviour
        lines = [line for line in pages[beh.page].splitlines() if f"`{beh.id}`" in line]
        assert lines, f"{beh.page} does not list behaviour `{beh.id}`"
        for line in lines:
            stated = _bold_verdicts(line)
            assert stated in ([], [dec.verdict]), (
                f"{beh.page}: `{beh.id}` says {stated}, the rule gives {dec.verdict!r}"
            )
        assert any(_bold_verdicts(line) == [dec.verdict] for line in lines), beh.id
    for check in registry.checks:
        assert f"`{check.id}`" in pages[check.page], f"{check.page} does not list `{check.id}`"
