"""docs/system_study.md's link medians are what pipeline/trace_medians.py computes from the traces,
each quoted under its own name: the population's median link (the median over clients of a
client's mean capacity) is not the pooled per-second median. And each uniform-links ablation's
committed params put every client on the links the page names. No training."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "pipeline" / "trace_medians.py"
PAGE = ROOT / "docs" / "system_study.md"
DATA = ROOT / "docs" / "system_study" / "data"
# "the pooled medians (2.21 down, 1.04 up Mbit/s", "the population's median links (5.03 down, ..."
QUOTE = re.compile(
    r"(pooled|population's) median(?:s| links) \(([0-9.]+) down, ([0-9.]+) up Mbit/s"
)
README_SLACK = 0.015  # the traces' README counts each trace's partial last second: 2.21, not 2.22


@pytest.fixture(scope="module")
def medians(data_root: Path) -> dict[str, dict[str, float]]:
    """Direction -> statistic -> Mbit/s, as the script prints them (2 decimals)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(data_root)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    head, *rows = done.stdout.splitlines()
    names = head.split()[2:5]  # direction traces pooled per_second population (Mbit/s)
    return {r.split()[0]: dict(zip(names, map(float, r.split()[2:]), strict=True)) for r in rows}


def test_the_statistics_differ(medians: dict[str, dict[str, float]]) -> None:
    for m in medians.values():  # else the page could not tell them apart
        assert abs(m["population"] - m["pooled"]) > 0.3


def test_the_page_quotes_each_median_under_its_own_name(
    medians: dict[str, dict[str, float]],
) -> None:
    quotes = QUOTE.findall(" ".join(PAGE.read_text().split()))  # lines joined
    assert {kind for kind, *_ in quotes} == {"pooled", "population's"}, quotes
    down, up = medians["down"], medians["up"]
    for kind, d, u in quotes:
        if kind == "pooled":
            assert float(d) == pytest.approx(down["pooled"], abs=README_SLACK)
            assert float(u) == pytest.approx(up["pooled"], abs=README_SLACK)
        else:
            assert (d, u) == (f"{down['population']:.2f}", f"{up['population']:.2f}")


@pytest.mark.parametrize(
    ("build", "statistic", "slack"),
    [
        ("system_study_uniform", "pooled", README_SLACK),
        ("system_study_uniform_pop", "population", 0.005),
    ],
)
def test_each_ablation_ran_on_the_links_the_page_names(
    medians: dict[str, dict[str, float]], build: str, statistic: str, slack: float
) -> None:
    files = sorted(DATA.glob(f"{build}_s[0-9]*.yaml"))
    assert files, build
    for f in files:
        links = yaml.safe_load(f.read_text())["train"]["system"]["links"]
        for direction in ("down", "up"):
            assert links[direction]["kind"] == "constant", f.name
            want = medians[direction][statistic]
            assert links[direction]["value"] == pytest.approx(want, abs=slack), f.name
