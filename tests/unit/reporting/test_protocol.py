"""Protocol v2 of the claims registry: designs fixed before the data, registrations checked
against git, n and group-sequential looks, diagnoses, sensitivity marks, headline claims."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.reporting.claims import ClaimsError, decide, load_registry
from fedcomm.reporting.sequential import sequential_bounds
from fedcomm.reporting.verdict import PENDING, REPRODUCED
from fedcomm.reporting.verdict_tables import blocks, design_text, fill
from tests.unit.reporting.test_verdict import (
    BEHAVIOURS,
    PAGE,
    _behaviour,
    _git,
    _registered,
    _registry,
)

ARMS = (
    {"label": "New", "curves": "data/c.csv", "run": "new"},
    {"label": "Old", "curves": "data/c.csv", "run": "old"},
)


def _edit(claims: Path, section: str, index: int, **change: Any) -> None:
    doc = yaml.safe_load(claims.read_text())
    doc[section][index].update(change)
    claims.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))


@pytest.mark.parametrize(
    ("protocol", "says"),
    [
        ({"n": 3, "measure": "final"}, "protocol.registered: Field required"),
        ({"n": 2, "measure": "final", "registered": "after-data"}, "protocol.n"),
        ({"n": 3, "measure": "final", "registered": "yesterday"}, "a commit hash"),
        ({"n": 5, "looks": [3, 4, 5, 5], "measure": "final", "registered": "after-data"}, "looks"),
        ({"n": 5, "looks": [3, 4], "measure": "final", "registered": "after-data"}, "looks"),
        ({"n": 3, "measure": "best_within_cap", "registered": "after-data"}, "cap_gib"),
        ({"n": 3, "measure": "final", "cap_gib": 1.0, "registered": "after-data"}, "cap_gib"),
        (
            {"n": 3, "measure": "best_within_cap", "cap_gib": 1.0, "registered": "after-data"},
            "axis: a capped measure states its traffic axis",
        ),
        (
            {"n": 3, "measure": "best_within_cap", "cap_gib": 2.0, "axis": "up_down"}
            | {"registered": "after-data"},
            "a: measures within 1.0 GiB (up_down), protocol: best_within_cap 2.0 GiB",
        ),
        ({"n": 3, "measure": "final", "chosen_among": 0, "registered": "after-data"}, "chosen"),
        (
            {"n": 3, "measure": "final", "registered": "after-data", "spending": "pocock"},
            "a: has within_gib, protocol measure is final",
        ),
        ({"n": 3, "measure": "final", "registered": "after-data", "m": 1}, "unknown key"),
    ],
)
def test_a_bad_protocol_is_one_line_naming_the_key(
    tmp_path: Path, protocol: dict[str, Any], says: str
) -> None:
    arms = ARMS
    if protocol.get("cap_gib") == 2.0 or "spending" in protocol:
        arms = tuple({**arm, "within_gib": 1.0} for arm in ARMS)  # type: ignore[assignment]
    path = _registry(tmp_path, [_behaviour("bad", *arms, protocol=protocol)])
    with pytest.raises(ClaimsError, match=r"id bad") as err:
        load_registry(path)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_registration_newer_than_its_data_is_refused(tmp_path: Path) -> None:
    claims = _registry(tmp_path, BEHAVIOURS[:1])
    root = claims.parent
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "claims and data together")
    both = _git(root, "rev-parse", "HEAD")
    doc = yaml.safe_load(claims.read_text())
    doc["behaviours"][0]["protocol"]["registered"] = both[:12]
    claims.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    with pytest.raises(ClaimsError, match="not after the registration") as err:
        decide(load_registry(claims))
    assert "after-data" in str(err.value)  # says how to keep the claim honestly
    # the honest statement is accepted, and the claim leaves the headline
    doc["behaviours"][0]["protocol"]["registered"] = "after-data"
    claims.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    (dec,) = decide(load_registry(claims))
    assert dec.verdict == REPRODUCED and not dec.standing.counted


def test_a_design_changed_after_its_registration_is_refused(tmp_path: Path) -> None:
    claims = _registered(_registry(tmp_path, BEHAVIOURS[:1]))
    assert decide(load_registry(claims))[0].standing.counted
    _edit(claims, "behaviours", 0, margin=-1.0)  # a margin chosen after the data
    with pytest.raises(ClaimsError, match=r"the design changed since .*: margin"):
        decide(load_registry(claims))
    _edit(
        claims,
        "behaviours",
        0,
        margin=0.0,
        protocol={"n": 3, "measure": "final", "registered": "0123456789ab"},
    )
    with pytest.raises(ClaimsError, match="does not exist"):
        decide(load_registry(claims))


def test_chosen_among_may_be_raised_after_the_registration_never_lowered(tmp_path: Path) -> None:
    """Paying for a choice made on the claim's own seeds (``chosen_among``) is allowed after
    the registration; taking the payment back, even to the registered value, is refused, with
    the commit that had it; other protocol keys stay fixed."""
    claims = _registered(_registry(tmp_path, BEHAVIOURS[:1]))
    root = claims.parent
    protocol = yaml.safe_load(claims.read_text())["behaviours"][0]["protocol"]
    _edit(claims, "behaviours", 0, protocol={**protocol, "chosen_among": 3})
    (paid,) = decide(load_registry(claims))
    assert paid.paired is not None and paid.paired.alpha == pytest.approx(0.05 / 3)
    _git(root, "add", "claims.yaml")
    _git(root, "commit", "-q", "-m", "pay for a choice")
    paying = _git(root, "rev-parse", "HEAD")[:12]
    for lowered in (2, None):
        back = {**protocol, "chosen_among": lowered} if lowered else protocol
        _edit(claims, "behaviours", 0, protocol=back)
        with pytest.raises(ClaimsError, match=f"commit {paying} had 3"):
            decide(load_registry(claims))
    _edit(claims, "behaviours", 0, protocol={**protocol, "chosen_among": 4})
    assert decide(load_registry(claims))[0].paired is not None
    _edit(
        claims,
        "behaviours",
        0,
        protocol={**protocol, "chosen_among": 4, "spending": "obrien_fleming"},
    )
    with pytest.raises(ClaimsError, match=r"the design changed since .*: protocol.spending"):
        decide(load_registry(claims))


def test_n_is_the_design_fewer_seeds_wait_more_are_refused(tmp_path: Path) -> None:
    four = {"n": 4, "measure": "final", "registered": "after-data"}
    two = {"n": 3, "measure": "final", "registered": "after-data"}
    path = _registry(
        tmp_path,
        [
            _behaviour("wait", *ARMS, protocol=four),
            _behaviour(
                "two", {**ARMS[0], "seeds": [0, 1]}, {**ARMS[1], "seeds": [0, 1]}, protocol=two
            ),
        ],
    )
    wait, short = decide(load_registry(path))
    assert wait.verdict == PENDING and wait.waiting == "3 of 4 seeds"
    assert wait.paired is not None and wait.paired.n == 3  # the numbers so far are shown
    assert short.verdict == PENDING and short.waiting == "2 of 3 seeds"
    _edit(path, "behaviours", 0, protocol={**four, "n": 3})
    _edit(path, "behaviours", 1, a={**ARMS[0], "seeds": [0, 1, 2, 3]})
    (tmp_path / "data" / "c.csv").write_text(
        (tmp_path / "data" / "c.csv").read_text() + "new,3,20,0.9\nold,3,20,0.8\n"
    )
    with pytest.raises(ClaimsError, match=r"the arms share 4 seeds, protocol\.n is 3"):
        decide(load_registry(path))


def test_a_group_sequential_claim_uses_the_bound_of_its_look(tmp_path: Path) -> None:
    rows = ["run,seed,round,global_accuracy"]
    # d = +1.3 ± 0.53 points, t = 2.44: past the fixed-n 2.132, short of Pocock's look-2 bound
    d = [0.010, 0.030, 0.002, 0.020, 0.003]
    rows += [f"new,{s},1,{0.5 + x}" for s, x in enumerate(d)]
    rows += [f"old,{s},1,0.5" for s in range(5)]
    looks = {"n": 5, "looks": [3, 5], "measure": "final", "registered": "after-data"}
    path = _registry(tmp_path, [_behaviour("seq", *ARMS, protocol=looks)])
    (tmp_path / "data" / "c.csv").write_text("\n".join(rows) + "\n")
    (dec,) = decide(load_registry(path))
    bounds = sequential_bounds((3, 5), 0.05, "pocock")
    assert dec.paired is not None and dec.paired.t_crit == pytest.approx(bounds[1])
    assert dec.paired.t == pytest.approx(2.44, abs=0.01) and 2.132 < dec.paired.t < bounds[1]
    assert dec.verdict == "in direction, not significant"
    # at the first look, only a pass stops the design; anything else waits for look 2
    _edit(
        path, "behaviours", 0, a={**ARMS[0], "seeds": [0, 1, 2]}, b={**ARMS[1], "seeds": [0, 1, 2]}
    )
    (first,) = decide(load_registry(path))
    assert first.paired is not None and first.paired.t_crit == pytest.approx(bounds[0])
    assert first.verdict == PENDING and first.waiting == "look 1: 3 seeds"
    table = blocks(load_registry(path), [first], tmp_path)["verdicts"]
    assert "**pending** (look 1: 3 seeds" in table and "looks 3/5 (pocock)" in table


def test_a_choice_made_on_the_claims_own_seeds_is_paid_for(tmp_path: Path) -> None:
    """``chosen_among: k`` tests at alpha / k (Bonferroni): t = 4.0 passes 2.920 at 5% and
    fails 4.303 at 2.5%."""
    rows = ["run,seed,round,global_accuracy"]
    d = [0.010, 0.020, 0.010]
    rows += [f"new,{s},1,{0.5 + x}" for s, x in enumerate(d)]
    rows += [f"old,{s},1,0.5" for s in range(3)]
    plain = {"n": 3, "measure": "final", "registered": "after-data"}
    path = _registry(tmp_path, [_behaviour("pick", *ARMS, protocol=plain)])
    (tmp_path / "data" / "c.csv").write_text("\n".join(rows) + "\n")
    (dec,) = decide(load_registry(path))
    assert dec.paired is not None and dec.paired.t == pytest.approx(4.0, abs=1e-3)
    assert dec.verdict == REPRODUCED and dec.paired.t_crit == pytest.approx(2.920, abs=1e-3)
    _edit(path, "behaviours", 0, protocol={**plain, "chosen_among": 2})
    (paid,) = decide(load_registry(path))
    assert paid.paired is not None and paid.paired.t_crit == pytest.approx(4.303, abs=1e-3)
    assert paid.paired.alpha == pytest.approx(0.025)
    assert paid.verdict == "in direction, not significant"
    assert design_text(paid) == "n 3; final; chosen among 2 (alpha / 2); after its data"
    # a group-sequential design spends the shared alpha over its looks
    seq = {"n": 5, "looks": [3, 5], "measure": "final", "registered": "after-data"}
    _edit(path, "behaviours", 0, protocol={**seq, "chosen_among": 2})
    (look,) = decide(load_registry(path))
    assert look.paired is not None
    assert look.paired.t_crit == pytest.approx(sequential_bounds((3, 5), 0.025, "pocock")[0])


def _cap_rows(run: str, seed: int, step_gib: float, accs: list[float]) -> list[str]:
    """Rows of one curve: round r has spent r x step GiB up + down, half of it upload."""
    out = []
    for r, acc in enumerate(accs, start=1):
        gib = r * step_gib
        out.append(f"{run},{seed},{r},{acc},{gib},{int(gib / 2 * 2**30)}")
    return out


def test_the_sensitivity_mark_varies_caps_and_the_axis(tmp_path: Path) -> None:
    """Sparse leads dense at 2 GiB of upload + download, and at 1.6 and 2.5 GiB (the cap's
    neighbours); on the upload axis dense has run twice as long by 2 GiB and leads: fragile."""
    rows = ["run,seed,round,global_accuracy,comm_cum_gib,comm_cum_up_bytes"]
    for seed in range(3):
        rows += _cap_rows("dense", seed, 1.0, [0.50, 0.60, 0.70, 0.95, 0.96])
        sparse = [0.55, 0.65, 0.75, 0.80, 0.81, 0.82, 0.83, 0.84, 0.85]
        rows += _cap_rows("sparse", seed, 0.5, [a + seed * 0.001 for a in sparse])
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cap.csv").write_text("\n".join(rows) + "\n")
    arm = {"curves": "data/cap.csv", "within_gib": 2.0}
    cap = {"n": 3, "measure": "best_within_cap", "cap_gib": 2.0, "axis": "up_down"}
    cap["registered"] = "after-data"
    path = _registry(
        tmp_path,
        [
            _behaviour(
                "cap",
                {"label": "S", "run": "sparse", **arm},
                {"label": "D", "run": "dense", **arm},
                protocol=cap,
            )
        ],
    )
    (dec,) = decide(load_registry(path))
    assert dec.verdict == REPRODUCED
    assert dec.sensitivity == "fragile (axis up: not reproduced)"


def test_diagnoses_are_decided_in_their_own_table_never_counted(tmp_path: Path) -> None:
    diag = _behaviour("diag", *ARMS, paper="FedSparse")
    claims = _registered(_registry(tmp_path, BEHAVIOURS[:1], diagnoses=[diag]))
    registry = load_registry(claims)
    behaviour, diagnosis = decide(registry)
    assert behaviour.standing.counted and diagnosis.section == "diagnoses"
    assert diagnosis.verdict == REPRODUCED and not diagnosis.standing.counted
    assert "a diagnosis" in diagnosis.standing.reasons
    shown = blocks(registry, [behaviour, diagnosis], tmp_path)
    assert "| claim diag<br>" in shown["diagnoses"] and "claim diag" not in shown["verdicts"]
    assert shown["verdicts"].startswith("1 of 1 counted behaviours reproduced by the rule")
    assert "1 diagnoses have their own table" in shown["verdicts"]
    page = tmp_path / "README.md"
    page.write_text(PAGE)  # no diagnoses markers: refused, naming them
    result = CliRunner().invoke(app, ["verdicts", str(claims), "--write", str(page)])
    assert result.exit_code == 2 and "<!-- diagnoses:begin -->" in result.output


def test_headline_claims_per_paper_and_a_headline_only_page(tmp_path: Path) -> None:
    first = dict(BEHAVIOURS[0], headline=True)
    claims = _registered(_registry(tmp_path, [first, *BEHAVIOURS[1:]]))
    registry = load_registry(claims)
    decided = decide(registry)
    shown = blocks(registry, decided, tmp_path)
    claims_line = "- **[FedBIAD](fedbiad.md)**: claim curves-case: **reproduced** (fragile)."
    assert claims_line in shown["verdicts"]
    readme = tmp_path / "TOP.md"
    readme.write_text("# top\n<!-- headline:begin -->\nold\n<!-- headline:end -->\ntail\n")
    text = fill(readme.read_text(), shown, readme)
    assert claims_line in text and "old" not in text and text.endswith("tail\n")
    assert "| Paper | Claim |" not in text  # the tables stay on the reproductions page


def test_a_headline_claim_that_fails_shows_its_sensitivity_mark_too(tmp_path: Path) -> None:
    failing = dict(BEHAVIOURS[0], headline=True, direction="less")
    claims = _registered(_registry(tmp_path, [failing]))
    registry = load_registry(claims)
    (dec,) = decide(registry)
    assert dec.verdict == "not reproduced" and dec.sensitivity
    mark = dec.sensitivity.split(" (")[0]
    line = f"- **[FedBIAD](fedbiad.md)**: claim curves-case: **not reproduced** ({mark})."
    assert line in blocks(registry, [dec], tmp_path)["verdicts"]


def test_a_paper_page_gets_its_own_headline_claims(tmp_path: Path) -> None:
    first = dict(BEHAVIOURS[0], headline=True)
    claims = _registered(_registry(tmp_path, [first, *BEHAVIOURS[1:]]))
    registry = load_registry(claims)
    shown = blocks(registry, decide(registry), tmp_path)
    page = tmp_path / "fedbiad.md"
    page.write_text("# FedBIAD\n<!-- headline:FedBIAD:begin -->\n<!-- headline:FedBIAD:end -->\n")
    text = fill(page.read_text(), shown, page)
    assert "claim curves-case (`curves-case`; n = 3: d = +2.00 ± 0.58" in text
    assert "**reproduced** (fragile (last 3:" in text
    assert "Of this paper's 3 behaviours, 2 are counted in the headline (1 reproduced)" in text
    assert "claim minus-case" not in text  # not a headline claim
    page.write_text("# FedBIAD\nno markers\n")
    result = CliRunner().invoke(app, ["verdicts", str(claims), "--check", str(page)])
    assert result.exit_code == 2 and "missing marker(s) <!-- verdicts:begin -->" in result.output


def test_a_capped_claim_registered_with_pending_arms_keeps_its_design(tmp_path: Path) -> None:
    """Registered before any run (pending arms), then given its curves: a pending arm measures
    what the protocol states, so adding ``within_gib`` is not a change of design."""
    cap = {"n": 2, "measure": "best_within_cap", "cap_gib": 2.0, "axis": "up_down"}
    cap["registered"] = "after-data"
    pending = {"pending": "the runs"}
    claims = _registry(
        tmp_path,
        [
            _behaviour(
                "cap",
                {"label": "S", **pending},
                {"label": "D", **pending},
                protocol={**cap, "n": 3},
            )
        ],
    )
    root = tmp_path
    _git(root, "init", "-q")
    _git(root, "add", "claims.yaml", "fedbiad.md")
    _git(root, "commit", "-q", "-m", "register")
    first = _git(root, "rev-parse", "HEAD")
    rows = ["run,seed,round,global_accuracy,comm_cum_gib,comm_cum_up_bytes"]
    for seed in range(3):
        rows += [
            f"{run},{seed},{r},{0.5 + r / 10 + (run == 's') * 0.01 * (seed + 1)},{r},0"
            for run in ("s", "d")
            for r in (1, 2, 3)
        ]
    (root / "data" / "cap.csv").write_text("\n".join(rows) + "\n")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "data")
    arm = {"curves": "data/cap.csv", "within_gib": 2.0}
    _edit(
        claims,
        "behaviours",
        0,
        a={"label": "S", "run": "s", **arm},
        b={"label": "D", "run": "d", **arm},
        protocol={**cap, "n": 3, "registered": first},
    )
    (dec,) = decide(load_registry(claims))
    assert dec.standing.counted and dec.verdict == REPRODUCED
    _edit(
        claims,
        "behaviours",
        0,
        a={"label": "S", "run": "s", **arm, "within_gib": 2.5},
        b={"label": "D", "run": "d", **arm, "within_gib": 2.5},
        protocol={**cap, "cap_gib": 2.5, "n": 3, "registered": first},
    )
    with pytest.raises(ClaimsError, match=r"design changed since .*cap_gib"):
        decide(load_registry(claims))
