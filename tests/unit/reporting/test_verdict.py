"""The decision rule (issue 29): Student's t, "final" per seed, the paired verdict, the claims
registry and ``fedcomm verdicts`` (print, --write, --check, --json)."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.reporting.claims import ClaimsError, decide, load_registry
from fedcomm.reporting.verdict import (
    IN_DIRECTION,
    NOT_REPRODUCED,
    REPRODUCED,
    TOO_FEW,
    betainc,
    final_per_seed,
    paired,
    t_cdf,
    t_critical,
)
from fedcomm.reporting.verdict_tables import headline

# --- Student's t -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "expected"),
    [(1, 6.313752), (2, 2.919986), (4, 2.131847), (30, 1.697261), (10**8, 1.644854)],
)
def test_t_critical_matches_the_table(df: int, expected: float) -> None:
    assert t_critical(df, 0.05) == pytest.approx(expected, abs=1e-6)


def test_t_cdf_known_values_and_symmetry() -> None:
    assert t_cdf(0.0, 3) == pytest.approx(0.5)
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert t_cdf(2.0, 5) == pytest.approx(0.9490302605850709, abs=1e-12)
    assert t_cdf(-1.3, 7) == pytest.approx(1.0 - t_cdf(1.3, 7), abs=1e-14)
    assert t_critical(9, 0.01) == pytest.approx(2.821438, abs=1e-6)
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-12)  # 1 - sum binomial


# --- "final" per seed --------------------------------------------------------------------------

CURVE = pl.DataFrame(
    {
        "run": ["x"] * 7 + ["y"],
        "seed": [0, 0, 0, 0, 1, 1, 1, 0],
        "round": [10, 20, 30, 40, 10, 20, 30, 40],
        "global_accuracy": [0.1, 0.3, None, 0.5, 0.2, None, None, 0.9],
    }
)


def test_final_is_the_mean_of_the_last_k_evaluations_skipping_nulls() -> None:
    f = final_per_seed(CURVE, "x", "global_accuracy", last_k=2)
    assert f.values == pytest.approx({0: 0.4, 1: 0.2})  # seed 0: rounds 20 and 40
    assert (f.k, f.fewest) == (2, 1)  # seed 1 has a single evaluation
    assert final_per_seed(CURVE, "x", "global_accuracy", last_k=1).values == pytest.approx(
        {0: 0.5, 1: 0.2}
    )


def test_final_skips_nan_as_it_skips_nulls() -> None:
    """An unevaluated round may be NaN (a CSV's "NaN") rather than null: skipped alike, as
    :func:`~fedcomm.evaluation.curve_points.final_value` skips it."""
    from fedcomm.evaluation.curve_points import final_value

    nan = CURVE.with_columns(pl.col("global_accuracy").fill_null(float("nan")))
    f = final_per_seed(nan, "x", "global_accuracy", last_k=2)
    assert f.values == pytest.approx({0: 0.4, 1: 0.2}) and (f.k, f.fewest) == (2, 1)
    seed0 = nan.filter((pl.col("run") == "x") & (pl.col("seed") == 0))
    assert final_value(seed0, "global_accuracy", 2) == pytest.approx(f.values[0])


def test_final_at_or_before_a_round_and_for_chosen_seeds() -> None:
    f = final_per_seed(CURVE, "x", "global_accuracy", last_k=2, at_round=20, seeds=[0])
    assert f.values == pytest.approx({0: 0.2})  # rounds 10 and 20


# --- the paired verdict ------------------------------------------------------------------------

A = {0: 0.91, 1: 0.92, 2: 0.95, 7: 0.5}  # seed 7 has no partner: left out
B = {0: 0.90, 1: 0.90, 2: 0.92}


def test_a_paired_case_computed_by_hand() -> None:
    # d = 1, 2, 3 points: mean 2, sd 1, SE 1/sqrt(3), t = 2 sqrt(3) = 3.464 > 2.920 at 2 df
    p = paired(A, B, scale=100.0)
    assert p.seeds == (0, 1, 2) and p.n == 3 and p.df == 2
    assert p.d == pytest.approx((1.0, 2.0, 3.0))
    assert p.mean == pytest.approx(2.0)
    assert p.se == pytest.approx(1 / math.sqrt(3))
    assert p.t == pytest.approx(2 * math.sqrt(3))
    assert p.t_crit == pytest.approx(2.919986, abs=1e-6)
    assert p.verdict == REPRODUCED


def test_margin_and_direction_decide_each_branch() -> None:
    # margin 0.5: t = 1.5 sqrt(3) = 2.598 < 2.920 -> in direction
    assert paired(A, B, scale=100.0, margin=0.5).verdict == IN_DIRECTION
    assert paired(A, B, scale=100.0, margin=0.5).t == pytest.approx(1.5 * math.sqrt(3))
    assert paired(A, B, scale=100.0, margin=2.0).verdict == NOT_REPRODUCED  # mean on the margin
    assert paired(A, B, scale=100.0, direction="less").verdict == NOT_REPRODUCED
    # "within 3 points below": d < 3 -> t = -1 * sqrt(3) ... in direction only
    assert paired(A, B, scale=100.0, direction="less", margin=3.0).verdict == IN_DIRECTION
    assert paired(A, B, scale=100.0, direction="less", margin=5.0).verdict == REPRODUCED
    # "within 1 point of" = greater with margin -1: t = 3 sqrt(3) = 5.196
    assert paired(B, A, scale=100.0, margin=-4.0).verdict == REPRODUCED
    assert paired(B, A, scale=100.0, margin=-1.0).verdict == NOT_REPRODUCED


def test_too_few_seeds() -> None:
    p = paired({0: 1.0, 1: 3.0}, {0: 0.0, 1: 0.0})
    assert p.verdict == TOO_FEW and p.n == 2 and p.t == pytest.approx(2.0)
    assert paired({0: 1.0}, {1: 0.0}).verdict == TOO_FEW  # no common seed


def test_zero_standard_error_is_decided_by_the_sign() -> None:
    same = {0: 2.0, 1: 2.0, 2: 2.0}
    zero = {0: 0.0, 1: 0.0, 2: 0.0}
    p = paired(same, zero)
    assert p.verdict == REPRODUCED and p.se == 0 and p.t == math.inf
    assert paired(same, zero, margin=2.0).verdict == NOT_REPRODUCED  # every d on the margin
    assert paired(same, zero, margin=2.0).t is None
    q = paired(zero, same)
    assert q.verdict == NOT_REPRODUCED and q.t == -math.inf
    assert paired(zero, same, direction="less").verdict == REPRODUCED


# --- the claims registry -----------------------------------------------------------------------


def _protocol(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """The protocol block the arms measure (n 3, registered after the data)."""
    out: dict[str, Any] = {"n": 3, "registered": "after-data", "measure": "final"}
    if a.get("within_gib") is not None:
        out |= {"measure": "best_within_cap", "cap_gib": a["within_gib"]}
        out["axis"] = a.get("axis") or "up_down"
    rounds = sorted({s["at_round"] for s in (a, b) if s.get("at_round") is not None})
    if rounds:
        out |= {"measure": "at_round", "at_round": rounds}
    return out


def _behaviour(ident: str, a: dict[str, Any], b: dict[str, Any], **extra: Any) -> dict[str, Any]:
    extra.setdefault("protocol", _protocol(a, b))
    return {
        "id": ident,
        "paper": "FedBIAD",
        "page": "fedbiad.md",
        "claim": f"claim {ident}",
        "paper_value": "+0.14",
        "metric": "global_accuracy",
        "scale": 100,
        "direction": "greater",
        "margin": 0.0,
        "a": a,
        "b": b,
        "setting": "MNIST",
        **extra,
    }


CURVES_CSV = """run,seed,round,global_accuracy
new,0,10,0.50
new,0,20,0.91
new,1,20,0.92
new,2,20,0.95
old,0,10,0.99
old,0,20,0.90
old,1,20,0.90
old,2,20,0.92
"""
ABLATIONS = {
    "note": "test",
    "runs": {
        "m: sp": [{"seed": s, "global/accuracy": v} for s, v in enumerate([0.90, 0.89, 0.88])],
        "m: base": [{"seed": s, "global/accuracy": v} for s, v in enumerate([0.93, 0.93, 0.93])],
    },
}


def _registry(tmp_path: Path, behaviours: list[dict[str, Any]], **top: Any) -> Path:
    (tmp_path / "fedbiad.md").write_text("# FedBIAD\n")
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "c.csv").write_text(CURVES_CSV)
    (tmp_path / "issue15_ablations.json").write_text(json.dumps(ABLATIONS))
    doc = {
        "rule": {"alpha": 0.05, "last_k": 1},
        "behaviours": behaviours,
        "checks": [
            {
                "id": "lm-upload",
                "paper": "FedBIAD",
                "page": "fedbiad.md",
                "what": "LM upload",
                "kind": "count",
                "paper_value": "1.82x",
                "fedcomm_value": "1.8231x",
                "agrees": True,
            }
        ],
        **top,
    }
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def _git(root: Path, *args: str) -> str:
    cmd = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


def _registered(claims: Path) -> Path:
    """The registry's folder made a git repository in which every claim with curves was
    registered (committed) before its data: the claims and page first, the data next; then the
    claims file names that first commit as each such claim's registration (protocol v2)."""
    root = claims.parent
    _git(root, "init", "-q")
    _git(root, "add", "claims.yaml", "fedbiad.md")
    _git(root, "commit", "-q", "-m", "register")
    first = _git(root, "rev-parse", "HEAD")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "data")
    doc = yaml.safe_load(claims.read_text())
    for beh in doc["behaviours"]:
        typed = any("ablations" in arm or "per_seed" in arm for arm in (beh["a"], beh["b"]))
        if not typed:
            beh["protocol"]["registered"] = first[:12]
    claims.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return claims


HEADLINE = (
    "1 of 2 counted behaviours reproduced by the rule (0 of them robust; 0 in direction, not "
    "significant; 0 not reproduced; 1 pending). 1 more behaviour is decided but not counted "
    "(registered after its data: 1; typed per-seed numbers: 1; 1 of them reproduced)"
)

BEHAVIOURS = [
    _behaviour(
        "curves-case",
        {"label": "New", "curves": "data/c.csv", "run": "new"},
        {"label": "Old", "curves": "data/c.csv", "run": "old"},
    ),
    _behaviour(  # ablations: per seed sp - base = -3, -4, -5 points
        "minus-case",
        {"label": "drop", "ablations": "m: sp", "minus": {"ablations": "m: base"}},
        {"label": "none", "per_seed": {0: 0.0, 1: 0.0, 2: 0.0}, "from": "no drop"},
        metric="global/accuracy",
        direction="less",
    ),
    _behaviour(
        "pending-case",
        {"label": "New", "pending": "run the CIFAR-10 table", "old": "91.2 ± 0.3"},
        {"label": "Old", "curves": "data/c.csv", "run": "old"},
    ),
]


def test_registry_decides_curves_minus_and_pending(tmp_path: Path) -> None:
    reg = load_registry(_registered(_registry(tmp_path, BEHAVIOURS)))
    curves, minus, pending = decide(reg)
    assert curves.paired is not None and curves.paired.d == pytest.approx((1.0, 2.0, 3.0))
    assert curves.verdict == REPRODUCED and curves.final == "last evaluation"
    assert minus.paired is not None and minus.paired.d == pytest.approx((-3.0, -4.0, -5.0))
    assert minus.verdict == REPRODUCED and minus.final.startswith("last evaluation")
    assert pending.verdict == "pending" and pending.paired is None
    assert curves.standing.counted and pending.standing.counted
    assert minus.standing.reasons == ("registered after its data", "typed per-seed numbers")
    # last 1 against the neighbours last 3 / last 10: the early 0.50 vs 0.99 turns seed 0 over
    assert curves.sensitivity.startswith("fragile (last 3: ")
    assert minus.sensitivity.startswith("not computable (typed") and pending.sensitivity == ""
    assert headline([curves, minus, pending]) == HEADLINE


def test_last_k_of_the_rule_is_used(tmp_path: Path) -> None:
    reg = load_registry(_registry(tmp_path, BEHAVIOURS[:1], rule={"last_k": 2}))
    (dec,) = decide(reg)
    assert dec.paired is not None
    # seed 0: new (0.50 + 0.91)/2, old (0.99 + 0.90)/2 -> d = -24 points; others unchanged
    assert dec.paired.d == pytest.approx((-24.0, 2.0, 3.0))
    assert dec.final == "mean of last 2 evaluations (fewest available: 1)"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            {"b": {"label": "Old", "curvs": "data/c.csv", "run": "old"}},
            "behaviours[0] (id curves-case): b.curvs: unknown key",
        ),
        (
            {"a": {"curves": "data/c.csv", "run": "new"}},
            "(id curves-case): a: an arm needs a `label`",
        ),
        (
            {"a": {"label": "x", "pending": "p", "per_seed": {0: 1.0}}},
            "(id curves-case): a: needs exactly one of curves, ablations, per_seed, pending",
        ),
        ({"direction": "up"}, "(id curves-case): direction: Input should be 'greater' or 'less'"),
        ({"a": {"label": "x", "per_seed": {0: 1.0}}}, "a: `per_seed` needs `from`"),
        ({"page": "nope.md"}, "id curves-case: page: 'nope.md' is not a file beside it"),
    ],
)
def test_a_bad_claims_file_is_one_line_naming_id_and_key(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    entry = {**BEHAVIOURS[0], **change}
    with pytest.raises(ClaimsError) as err:
        load_registry(_registry(tmp_path, [entry]))
    assert expected in str(err.value) and "\n" not in str(err.value)
    assert str(err.value).startswith(str(tmp_path / "claims.yaml"))


def test_bad_references_name_the_id_and_key(tmp_path: Path) -> None:
    bad_run = {**BEHAVIOURS[0], "b": {"label": "Old", "curves": "data/c.csv", "run": "gone"}}
    with pytest.raises(ClaimsError, match=r"id curves-case: b\.run: 'gone' is not a run"):
        decide(load_registry(_registry(tmp_path, [bad_run])))
    bad_key = {**BEHAVIOURS[1], "a": {"label": "x", "ablations": "m: nope"}}
    with pytest.raises(ClaimsError, match=r"id minus-case: a\.ablations: no key 'm: nope'"):
        decide(load_registry(_registry(tmp_path, [bad_key])))
    twice = [BEHAVIOURS[0], {**BEHAVIOURS[2], "id": "lm-upload"}]
    with pytest.raises(ClaimsError, match="id lm-upload: used twice"):
        load_registry(_registry(tmp_path, twice))


# --- the command -------------------------------------------------------------------------------

PAGE = """# Reproductions

<!-- verdicts:begin -->
stale
<!-- verdicts:end -->

text between

<!-- checks:begin -->
<!-- checks:end -->
"""


def test_verdicts_write_then_check_round_trip(tmp_path: Path) -> None:
    claims = _registered(_registry(tmp_path, BEHAVIOURS))
    page = tmp_path / "README.md"
    page.write_text(PAGE)
    runner = CliRunner()
    stale = runner.invoke(app, ["verdicts", str(claims), "--check", str(page)])
    assert stale.exit_code == 1 and "-stale" in stale.output
    out = tmp_path / "v.json"
    wrote = runner.invoke(app, ["verdicts", str(claims), "--write", str(page), "--json", str(out)])
    assert wrote.exit_code == 0, wrote.output
    text = page.read_text()
    assert "stale" not in text and "text between" in text
    assert HEADLINE in text
    assert "n = 3: d = +2.00 ± 0.58, t = 3.46 (2 df)" in text
    assert "**reproduced** (t > 2.920; final = last evaluation)" in text
    assert "**pending**: run the CIFAR-10 table" in text and "New: 91.2 ± 0.3" in text
    assert "| [FedBIAD](fedbiad.md) | LM upload | count | 1.82x | 1.8231x | yes |" in text
    assert runner.invoke(app, ["verdicts", str(claims), "--check", str(page)]).exit_code == 0
    doc = json.loads(out.read_text())
    assert doc["behaviours"][0]["paired"]["t"] == pytest.approx(2 * math.sqrt(3))
    assert doc["behaviours"][2]["verdict"] == "pending"
    # the page edited by hand is caught
    page.write_text(text.replace("t = 3.46", "t = 9.99"))
    assert runner.invoke(app, ["verdicts", str(claims), "--check", str(page)]).exit_code == 1


def test_verdicts_missing_markers_exit_2_naming_them(tmp_path: Path) -> None:
    claims = _registry(tmp_path, BEHAVIOURS)
    page = tmp_path / "README.md"
    page.write_text(PAGE.replace("<!-- checks:end -->\n", ""))
    result = CliRunner().invoke(app, ["verdicts", str(claims), "--write", str(page)])
    assert result.exit_code == 2
    assert "missing marker(s) <!-- checks:end -->" in result.output
    assert page.read_text() == PAGE.replace("<!-- checks:end -->\n", "")  # untouched


def test_verdicts_prints_both_tables(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["verdicts", str(_registry(tmp_path, BEHAVIOURS))])
    assert result.exit_code == 0, result.output
    assert "| Paper | Claim | Paper's number |" in result.output
    assert "| Paper | Check | Kind |" in result.output


UNTESTED = [
    {
        "id": "fmnist",
        "paper": "FedBIAD",
        "page": "fedbiad.md",
        "claim": "FMNIST gain",
        "paper_value": 2.4,
        "setting": "Fashion-MNIST",
        "needs": "Fashion-MNIST data",
    }
]
UNTESTED_MARKERS = "<!-- untested:begin -->\nstale\n<!-- untested:end -->\n"


def test_untested_claims_are_listed_never_decided_or_counted(tmp_path: Path) -> None:
    claims = _registered(_registry(tmp_path, BEHAVIOURS, untested=UNTESTED))
    reg = load_registry(claims)
    assert [u.id for u in reg.untested] == ["fmnist"] and reg.untested[0].paper_value == "2.4"
    assert len(decide(reg)) == len(BEHAVIOURS)
    page = tmp_path / "README.md"
    page.write_text(PAGE)
    runner = CliRunner()
    result = runner.invoke(app, ["verdicts", str(claims), "--write", str(page)])
    assert result.exit_code == 2 and "<!-- untested:begin -->" in result.output
    assert page.read_text() == PAGE  # untouched
    page.write_text(PAGE + UNTESTED_MARKERS)
    result = runner.invoke(app, ["verdicts", str(claims), "--write", str(page)])
    assert result.exit_code == 0, result.output
    text = page.read_text()
    assert HEADLINE in text and "stale" not in text
    assert "1 claim is not tested here" in text
    row = "| [FedBIAD](fedbiad.md) | FMNIST gain<br>*Fashion-MNIST* | 2.4 | Fashion-MNIST data |  |"
    assert row in text
    assert runner.invoke(app, ["verdicts", str(claims), "--check", str(page)]).exit_code == 0
    # once there are none, the block is emptied and the headline says nothing of them
    plain = _registry(tmp_path, BEHAVIOURS)
    assert runner.invoke(app, ["verdicts", str(plain), "--write", str(page)]).exit_code == 0
    text = page.read_text()
    assert "<!-- untested:begin -->\n\n<!-- untested:end -->" in text
    assert "not tested here" not in text


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"id": "curves-case"}, "id curves-case: used twice"),
        ({"needs": ""}, "untested[0] (id fmnist): needs: String should have at least 1 character"),
        ({"metric": "x"}, "untested[0] (id fmnist): metric: unknown key"),
    ],
)
def test_a_bad_untested_claim_is_one_line(
    tmp_path: Path, change: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ClaimsError) as err:
        load_registry(_registry(tmp_path, BEHAVIOURS, untested=[{**UNTESTED[0], **change}]))
    assert expected in str(err.value) and "\n" not in str(err.value)


CAP_CSV = """run,seed,round,global_accuracy,comm_cum_gib,comm_cum_up_bytes
dense,0,1,0.50,1.0,536870912
dense,0,2,0.80,2.0,1073741824
dense,0,3,0.99,3.0,1610612736
dense,1,1,0.60,1.0,536870912
dense,1,2,0.70,2.0,1073741824
dense,1,3,0.95,3.0,1610612736
sparse,0,1,0.55,0.5,268435456
sparse,0,2,0.85,1.0,536870912
sparse,0,4,0.90,2.0,1073741824
sparse,0,5,0.97,3.0,1610612736
sparse,1,2,0.75,1.0,536870912
sparse,1,4,0.65,2.0,1073741824
sparse,1,6,0.99,3.0,1610612736
"""


def test_best_within_a_traffic_cap_on_either_axis(tmp_path: Path) -> None:
    """``within_gib``: per seed the best evaluation inside the cap (inclusive), not the final."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cap.csv").write_text(CAP_CSV)
    arm = {"curves": "data/cap.csv", "within_gib": 2.0}
    behaviours = [
        _behaviour(
            "up-down", {"label": "S", "run": "sparse", **arm}, {"label": "D", "run": "dense", **arm}
        ),
        _behaviour(
            "up-only",
            {"label": "S", "run": "sparse", **arm, "axis": "up", "within_gib": 0.5},
            {"label": "D", "run": "dense", **arm, "axis": "up", "within_gib": 0.5},
        ),
    ]
    up_down, up = decide(load_registry(_registry(tmp_path, behaviours)))
    # up + down <= 2 GiB: sparse 0.90 / 0.75, dense 0.80 / 0.70 (round 3's 0.99 is past the cap)
    assert up_down.paired is not None and up_down.paired.d == pytest.approx((10.0, 5.0))
    assert up_down.final == "best within 2 GiB (cumulative upload + download of all clients)"
    # upload <= 0.5 GiB (inclusive): sparse 0.85 / 0.75, dense 0.50 / 0.60
    assert up.paired is not None and up.paired.d == pytest.approx((35.0, 15.0))
    assert "cumulative upload of all clients" in up.final
    # a curve that does not go past the cap has only a best so far: its seed is left out
    (short,) = decide(
        load_registry(
            _registry(
                tmp_path,
                [
                    _behaviour(
                        "not-past",
                        {"label": "S", "run": "sparse", **arm, "within_gib": 3.0},
                        {"label": "D", "run": "dense", **arm, "within_gib": 3.0},
                    )
                ],
            )
        )
    )
    assert short.a.values == {} and short.b.values == {}


def test_a_run_that_ended_inside_the_cap_counts_its_best_when_told(tmp_path: Path) -> None:
    """``ended_inside: best``: a finished run that never spent the cap counts its best (a lower
    bound of its best within the cap); without it the seed is left out (test above)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "cap.csv").write_text(CAP_CSV)
    arm = {"curves": "data/cap.csv", "within_gib": 3.0}
    (ended,) = decide(
        load_registry(
            _registry(
                tmp_path,
                [
                    _behaviour(
                        "ended-inside",
                        {"label": "S", "run": "sparse", **arm, "ended_inside": "best"},
                        {"label": "D", "run": "dense", **arm, "ended_inside": "best"},
                    )
                ],
            )
        )
    )
    # both end at 3.0 GiB (not past 3): sparse's best 0.97 / 0.99, dense's 0.99 / 0.95
    assert ended.a.values == pytest.approx({0: 0.97, 1: 0.99})
    assert ended.paired is not None and ended.paired.d == pytest.approx((-2.0, 4.0))
    assert "a run that ended inside it: its best" in ended.final


@pytest.mark.parametrize(
    ("arm", "says"),
    [
        ({"axis": "up"}, "`axis` goes with `within_gib`"),
        ({"within_gib": 1.0, "at_round": 3}, "exclude each other"),
        ({"within_gib": 0.0}, "within_gib"),
        ({"within_gib": 1.0, "axis": "down"}, "axis"),
        ({"ended_inside": "best"}, "`ended_inside` goes with `within_gib`"),
        ({"within_gib": 1.0, "ended_inside": "last"}, "ended_inside"),
    ],
)
def test_bad_cap_sources_are_one_line_errors(
    tmp_path: Path, arm: dict[str, Any], says: str
) -> None:
    src = {"label": "S", "curves": "data/c.csv", "run": "new", **arm}
    path = _registry(
        tmp_path,
        [_behaviour("cap-case", src, {"label": "O", "curves": "data/c.csv", "run": "old"})],
    )
    with pytest.raises(ClaimsError, match=r"cap-case") as err:
        load_registry(path)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_curves_glob_stacks_the_per_seed_files(tmp_path: Path) -> None:
    """``curves: data/x_s*.csv`` reads every per-seed CSV of pipeline/per_seed.sh as one table."""
    (tmp_path / "data").mkdir()
    rows = CURVES_CSV.splitlines()
    for seed in (0, 1, 2):  # the same rows as data/c.csv, split by seed
        part = [r for r in rows[1:] if r.split(",")[1] == str(seed)]
        (tmp_path / "data" / f"x_s{seed}.csv").write_text("\n".join([rows[0], *part]) + "\n")
    arm = {"curves": "data/x_s*.csv"}
    beh = [
        _behaviour(
            "glob-case", {"label": "N", "run": "new", **arm}, {"label": "O", "run": "old", **arm}
        )
    ]
    (dec,) = decide(load_registry(_registry(tmp_path, beh)))
    assert dec.paired is not None and dec.paired.d == pytest.approx((1.0, 2.0, 3.0))
    bad = [
        _behaviour(
            "glob-none",
            {"label": "N", "run": "new", "curves": "data/y_s*.csv"},
            {"label": "O", "run": "old", **arm},
        )
    ]
    with pytest.raises(ClaimsError, match=r"glob-none.*y_s\*\.csv: no such file"):
        decide(load_registry(_registry(tmp_path, bad)))
