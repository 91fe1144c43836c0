"""A paper's table beside fedcomm's numbers (the registry's ``tables``), computed from the
committed curves: per run and column, the mean ± standard error over the table's seeds of each
seed's final (the mean of the rule's last k evaluations, as a verdict takes it) or last value.
``fedcomm verdicts --write PAGE`` fills the block between ``<!-- table:<id>:begin -->`` and
``<!-- table:<id>:end -->`` wherever a page has it; nothing in it is typed by hand."""

from __future__ import annotations

import math
from pathlib import Path

from fedcomm.evaluation.caps import CAP_AXIS_WORDS
from fedcomm.reporting.claims_schema import ClaimsError, Registry, Rule, Source
from fedcomm.reporting.paper_table_schema import Column, PaperTable
from fedcomm.reporting.sources import Files, resolve


def markers(table_id: str) -> tuple[str, str]:
    return f"<!-- table:{table_id}:begin -->", f"<!-- table:{table_id}:end -->"


def _mean_se(values: list[float]) -> tuple[float, float | None]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def cell(values: dict[int, float], col: Column, seeds: list[int]) -> str:
    """``mean ± SE`` of one column over the seeds that have it (their count when fewer than
    the table's); when none has, ``not reached`` for a cap, else ``pending``."""
    got = [values[s] * col.scale for s in seeds if s in values]
    if not got:  # the run is there: a cap its curves never pass, or no evaluation yet
        return "not reached (the runs end inside it)" if col.within_gib else "pending"
    mean, se = _mean_se(got)
    text = f"{mean:.{col.digits}f}" + ("" if se is None else f" ± {se:.{col.digits}f}")
    return text if len(got) == len(seeds) else f"{text} ({len(got)} of {len(seeds)} seeds)"


def table_values(
    table: PaperTable, rule: Rule, files: Files
) -> dict[str, list[dict[int, float] | None]]:
    """Per run: each column's per-seed values, read as a claim's arm reads them
    (:func:`~.sources.resolve`); None: the run is not in its curves yet (or they are not
    committed yet)."""
    where = f"tables ({table.id})"
    last = rule.model_copy(update={"last_k": 1})
    out: dict[str, list[dict[int, float] | None]] = {}
    for row in table.rows:
        curves = row.curves or table.curves
        if not _runs(curves, files, where) >= {row.run}:
            out[row.run] = [None] * len(table.columns)
            continue
        per_col: list[dict[int, float] | None] = []
        for col in table.columns:
            src = Source(
                curves=curves,
                run=row.run,
                seeds=table.seeds,
                within_gib=col.within_gib,
                axis=col.axis,
            )
            got = resolve(src, col.metric, rule if col.at == "final" else last, files, where)
            per_col.append(got.values)
        out[row.run] = per_col
    return out


def _runs(curves: str, files: Files, where: str) -> set[str]:
    """The runs in ``curves``; none when no file matches yet (a table filled as seeds land)."""
    if not sorted(files.root.glob(curves)):
        return set()
    return set(files.curves(curves, where)["run"])


def render(table: PaperTable, rule: Rule, files: Files) -> str:
    """The markdown of one table: a title line, the table, what "final" means."""
    values = table_values(table, rule, files)
    head = ["run", *(c.label for c in table.columns), table.paper_header]
    lines = [
        f"**{table.title}** (mean ± SE over seeds {', '.join(map(str, table.seeds))})",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(table.columns) + "---|",
    ]
    for row in table.rows:
        cols = values[row.run]
        cells = [
            "pending" if per_seed is None else cell(per_seed, col, table.seeds)
            for per_seed, col in zip(cols, table.columns, strict=True)
        ]
        lines.append("| " + " | ".join([row.label, *cells, row.paper or "–"]) + " |")
    plain = [c for c in table.columns if c.within_gib is None]
    finals = [c.label for c in plain if c.at == "final"]
    lasts = [c.label for c in plain if c.at == "last"]
    said = []
    if finals:
        said.append(f"{', '.join(finals)}: each seed's mean of its last {rule.last_k} evaluations")
    if lasts:
        said.append(f"{', '.join(lasts)}: each seed's last evaluation")
    capped = [c for c in table.columns if c.within_gib is not None and c.axis is not None]
    for c in capped:
        said.append(
            f"{c.label}: each seed's best evaluation within {c.within_gib:g} GiB "
            f"({CAP_AXIS_WORDS[c.axis or 'up_down']})"
        )
    if capped:
        said.append("a seed whose run ends inside a cap is left out")
    read = sorted({row.curves or table.curves for row in table.rows})
    src = "curves " + ", ".join(f"`{f}`" for f in read)
    lines += ["", f"*Computed from the {src} by `fedcomm verdicts`; {'; '.join(said)}.*"]
    if table.note:
        lines += ["", table.note]
    return "\n".join(lines)


def table_blocks(registry: Registry) -> dict[str, str]:
    """``{"table:<id>": markdown}`` for every table of the registry."""
    files = Files(registry.root)
    return {f"table:{t.id}": render(t, registry.rule, files) for t in registry.tables}


def fill_tables(text: str, contents: dict[str, str], name: Path) -> str:
    """``text`` with each ``table:<id>`` block it has refilled (a page holds the tables it
    shows; one it lacks is simply not there). :class:`ClaimsError` on a marker of an unknown
    table, or markers out of order."""
    for begin_at in _table_markers_in(text):
        block = begin_at.removeprefix("<!-- ").removesuffix(":begin -->")
        if block not in contents:
            raise ClaimsError(f"{name}: {begin_at} names no table of the registry")
        begin, end = markers(block.removeprefix("table:"))
        i, j = text.find(begin), text.find(end)
        if j < i:
            raise ClaimsError(f"{name}: marker {begin} must come before {end}")
        text = text[: i + len(begin)] + "\n" + contents[block] + "\n" + text[j:]
    return text


def _table_markers_in(text: str) -> list[str]:
    out, at = [], 0
    while (i := text.find("<!-- table:", at)) >= 0:
        j = text.find(" -->", i)
        if j < 0:
            raise ClaimsError(f"an unclosed marker: {text[i : i + 60]!r}")
        tag = text[i : j + 4]
        if tag.endswith(":begin -->"):
            out.append(tag)
        at = j + 4
    return out
