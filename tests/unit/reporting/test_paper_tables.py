"""A paper's table beside fedcomm's numbers (the registry's ``tables``): computed from curves as
a claim's arm reads them, filled into a page's marker blocks, kept in step by --check."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from fedcomm.cli import app
from fedcomm.reporting.claims import ClaimsError, load_registry
from fedcomm.reporting.paper_tables import table_blocks

# two runs x seeds 0-2, rounds 1-6; acc rises 0.1 a round from a seed offset, 1 GiB a round
# (half of it upload) for dense, 0.25 for sparse; sparse's seed 2 is missing
ROWS = ["run,seed,round,global_accuracy,comm_cum_gib,comm_cum_up_bytes"]
for _run, _step, _seeds in (("dense", 1.0, (0, 1, 2)), ("sparse", 0.25, (0, 1))):
    for _seed in _seeds:
        for _r in range(1, 7):
            _gib = _r * _step
            _acc = 0.1 * _r + 0.01 * _seed + (0.05 if _run == "sparse" else 0.0)
            ROWS.append(f"{_run},{_seed},{_r},{_acc},{_gib},{int(_gib / 2 * 2**30)}")

TABLE: dict[str, Any] = {
    "id": "t1",
    "paper": "FedBIAD",
    "page": "fedbiad.md",
    "title": "Table I",
    "curves": "data/t_s*.csv",
    "seeds": [0, 1, 2],
    "columns": [
        {"metric": "global_accuracy", "label": "acc", "scale": 100},
        {"metric": "comm_cum_gib", "label": "GiB", "at": "last"},
        {
            "metric": "global_accuracy",
            "label": "best within 2 GiB",
            "within_gib": 2.0,
            "axis": "up_down",
            "scale": 100,
        },
    ],
    "paper_header": "the paper",
    "rows": [
        {"run": "dense", "label": "Dense", "paper": "95.06"},
        {"run": "sparse", "label": "Sparse", "paper": "95.20"},
        {"run": "other", "label": "Other", "paper": "–", "curves": "data/other.csv"},
    ],
}

PAGE = "# FedBIAD\n\n<!-- table:t1:begin -->\nstale\n<!-- table:t1:end -->\n\ntext after\n"


def _setup(tmp_path: Path, table: dict[str, Any] | None = None, last_k: int = 2) -> Path:
    (tmp_path / "data").mkdir(exist_ok=True)
    for seed in (0, 1, 2):
        rows = [ROWS[0]] + [r for r in ROWS[1:] if r.split(",")[1] == str(seed)]
        (tmp_path / "data" / f"t_s{seed}.csv").write_text("\n".join(rows) + "\n")
    # a run kept in another file (a row's own curves): seed 0 only, 3 rounds of 1 GiB
    other = [ROWS[0]] + [f"other,0,{r},0.{r},{r}.0,{2**29 * r}" for r in (1, 2, 3)]
    (tmp_path / "data" / "other.csv").write_text("\n".join(other) + "\n")
    (tmp_path / "fedbiad.md").write_text(PAGE)
    doc = {
        "rule": {"alpha": 0.05, "last_k": last_k},
        "behaviours": [],
        "checks": [],
        "tables": [table or TABLE],
    }
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    return path


def _se(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def test_a_table_is_computed_from_the_curves(tmp_path: Path) -> None:
    (text,) = table_blocks(load_registry(_setup(tmp_path))).values()
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()}
    # final = mean of the last 2 evaluations (rounds 5, 6): 55 + seed points for dense, mean 56
    dense = [55.0, 56.0, 57.0]
    assert f"56.00 ± {_se(dense):.2f}" in lines["Dense"] and "95.06" in lines["Dense"]
    # last: 6 GiB; best within 2 GiB: rounds 1-2 → 20 + seed points
    assert "| 6.00 ± 0.00 |" in lines["Dense"] and f"| 21.00 ± {_se(dense):.2f} |" in lines["Dense"]
    # sparse has seeds 0 and 1 only, says so; its 6 rounds spend 1.5 GiB: the cap is not reached
    assert "60.50 ± 0.50 (2 of 3 seeds)" in lines["Sparse"]
    assert "not reached (the runs end inside it)" in lines["Sparse"]
    # its own file: seed 0 only; final (0.2 + 0.3) / 2, last 3 GiB, best within 2 GiB 0.2
    assert (
        lines["Other"]
        == "| Other | 25.00 (1 of 3 seeds) | 3.00 (1 of 3 seeds) | 20.00 (1 of 3 seeds) | – |"
    )
    assert "mean of its last 2 evaluations" in text and "within 2 GiB (cumulative upload +" in text


def test_a_table_before_its_curves_exist_is_pending(tmp_path: Path) -> None:
    path = _setup(tmp_path, {**TABLE, "curves": "data/none_s*.csv"})
    (text,) = table_blocks(load_registry(path)).values()
    assert text.count("| pending | pending | pending |") == 2  # Other reads its own file


def test_a_typo_in_a_table_is_an_error_not_a_pending_row(tmp_path: Path) -> None:
    rows = [*TABLE["rows"][:2], {"run": "sparce", "label": "typo"}]
    with pytest.raises(ClaimsError, match="run 'sparce' is not a run of data/t_s"):
        table_blocks(load_registry(_setup(tmp_path, {**TABLE, "rows": rows})))
    with pytest.raises(ClaimsError, match="no such file"):
        table_blocks(load_registry(_setup(tmp_path, {**TABLE, "curves": "data/t.csv"})))


def test_verdicts_fills_a_pages_table_and_check_catches_a_hand_edit(tmp_path: Path) -> None:
    path = _setup(tmp_path)
    page = tmp_path / "fedbiad.md"
    result = CliRunner().invoke(app, ["verdicts", str(path), "--write", str(page)])
    assert result.exit_code == 0, result.output
    filled = page.read_text()
    assert "stale" not in filled and "| Dense | 56.00 ±" in filled and "text after" in filled
    assert CliRunner().invoke(app, ["verdicts", str(path), "--check", str(page)]).exit_code == 0
    page.write_text(filled.replace("| Dense | 56.00", "| Dense | 57.00"))
    result = CliRunner().invoke(app, ["verdicts", str(path), "--check", str(page)])
    assert result.exit_code == 1 and "| Dense | 56.00" in result.output


@pytest.mark.parametrize(
    ("page", "says"),
    [
        ("<!-- table:t9:begin -->\n<!-- table:t9:end -->\n", "names no table of the registry"),
        ("<!-- table:t1:end -->\n<!-- table:t1:begin -->\n", "found end, begin"),
        ("<!-- table:t1:begin -->\n", "found begin"),
        (PAGE + PAGE, "found begin, end, begin, end"),
    ],
)
def test_a_bad_table_marker_is_one_line(tmp_path: Path, page: str, says: str) -> None:
    path = _setup(tmp_path)
    target = tmp_path / "fedbiad.md"
    target.write_text(page)
    result = CliRunner().invoke(app, ["verdicts", str(path), "--write", str(target)])
    assert result.exit_code == 2 and says in result.output
    assert target.read_text() == page  # nothing written


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"columns": [{"metric": "m", "label": "x", "colour": 1}]}, "unknown key (allowed: metric"),
        ({"columns": [{"metric": "m", "label": "x", "within_gib": 1.0}]}, "go together"),
        (
            {
                "columns": [
                    {"metric": "m", "label": "x", "within_gib": 1.0, "axis": "up"} | {"at": "last"}
                ]
            },
            "a capped column takes the best",
        ),
        ({"rows": [{"run": "a", "label": "A"}, {"run": "a", "label": "B"}]}, "each run once"),
        ({"seeds": []}, "seeds"),
        ({"page": "missing.md"}, "is not a file beside it"),
    ],
)
def test_a_bad_table_entry_is_one_line_naming_the_key(
    tmp_path: Path, change: dict[str, Any], says: str
) -> None:
    path = _setup(tmp_path, {**TABLE, **change})
    with pytest.raises(ClaimsError, match=r"tables\[0\] \(id t1\)|id t1") as err:
        load_registry(path)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_metric_the_curves_lack_is_named(tmp_path: Path) -> None:
    table = {**TABLE, "columns": [{"metric": "topk_accuracy", "label": "top-3"}]}
    with pytest.raises(ClaimsError, match="has no column 'topk_accuracy'"):
        table_blocks(load_registry(_setup(tmp_path, table)))


def test_a_page_of_tables_alone_needs_no_verdict_markers_but_a_readme_does(tmp_path: Path) -> None:
    """A paper page may hold table blocks and nothing else; a page with the verdict tables'
    markers still needs every one of them (a mention of the table syntax in prose is not a
    block)."""
    path = _setup(tmp_path)
    readme = tmp_path / "README.md"
    readme.write_text(
        "# R\n\n<!-- verdicts:begin -->\n<!-- verdicts:end -->\n\nsee `<!-- table:<id> -->`\n"
    )
    result = CliRunner().invoke(app, ["verdicts", str(path), "--write", str(readme)])
    assert result.exit_code == 2 and "missing marker(s)" in result.output
