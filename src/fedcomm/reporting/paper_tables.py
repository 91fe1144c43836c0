"""A paper's table beside fedcomm's numbers (the registry's ``tables``), computed from the
committed curves: per run and column, the mean ± standard error over the table's seeds of each
seed's final (the mean of the rule's last k evaluations, as a verdict takes it) or last value.
``fedcomm verdicts --write PAGE`` fills the block between ``<!-- table:<id>:begin -->`` and
``<!-- table:<id>:end -->`` wherever a page has it; nothing in it is typed by hand."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from fedcomm.evaluation.caps import CAP_AXIS_WORDS
from fedcomm.evaluation.seeds import mean_se
from fedcomm.reporting.claims_schema import ClaimsError, Registry, Rule, Source
from fedcomm.reporting.paper_table_schema import Column, PaperTable
from fedcomm.reporting.sources import Files, resolve


def markers(table_id: str) -> tuple[str, str]:
    return f"<!-- table:{table_id}:begin -->", f"<!-- table:{table_id}:end -->"


def cell(values: dict[int, float], col: Column, seeds: list[int], ran: set[int]) -> str:
    """``mean ± SE`` of one column over the seeds that have it (their count when fewer than
    the table's); when none has, ``not reached`` for a cap the seeds that ran (``ran``) never
    pass, else ``pending``."""
    got = [values[s] * col.scale for s in seeds if s in values]
    if not got:
        return "not reached (the runs end inside it)" if col.within_gib and ran else "pending"
    pooled = mean_se(got)
    mean, se = float(pooled["mean"] or 0.0), float(pooled["se"] or 0.0)
    text = f"{mean:.{col.digits}f}" + (f" ± {se:.{col.digits}f}" if len(got) > 1 else "")
    return text if len(got) == len(seeds) else f"{text} ({len(got)} of {len(seeds)} seeds)"


Values = list[dict[int, float] | None]  # per column: each seed's value (None: pending)


def table_values(table: PaperTable, rule: Rule, files: Files) -> dict[str, tuple[set[int], Values]]:
    """Per run: the table's seeds it has curves for, and each column's per-seed values, read
    as a claim's arm reads them (:func:`~.sources.resolve`); None for every run while no file
    matches a per-seed glob yet (a table filled as its seeds land). A plain path that does not
    exist, or a run its curves do not hold, is an error (a typo, not a pending run)."""
    where = f"tables ({table.id})"
    last = rule.model_copy(update={"last_k": 1})
    out: dict[str, tuple[set[int], Values]] = {}
    for row in table.rows:
        curves = row.curves or table.curves
        if not _landed(curves, files):
            out[row.run] = (set(), [None] * len(table.columns))
            continue
        frame = files.curves(curves, where)
        if row.run not in set(frame["run"]):
            raise ClaimsError(f"{where}: run {row.run!r} is not a run of {curves}")
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
        ran = set(frame.filter(pl.col("run") == row.run)["seed"].to_list()) & set(table.seeds)
        out[row.run] = (ran, per_col)
    return out


def _landed(curves: str, files: Files) -> bool:
    """Whether any file of ``curves`` exists; False only for a glob none matches yet (a plain
    path that is missing is left to :meth:`Files.curves`, which names it)."""
    if not any(c in curves for c in "*?["):
        return True
    return bool(sorted(files.root.glob(curves)))


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
        ran, cols = values[row.run]
        cells = [
            "pending" if per_seed is None else cell(per_seed, col, table.seeds, ran)
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


MARKER = re.compile(r"<!-- table:([^ ]*?):(begin|end) -->")


def fill_tables(text: str, contents: dict[str, str], name: Path) -> tuple[str, int]:
    """``text`` with each ``table:<id>`` block it has refilled, and how many (a page holds the
    tables it shows). :class:`ClaimsError` (one line, naming the page) on a marker of an
    unknown table, a block that is not one begin before one end, or a block given twice."""
    found: dict[str, list[str]] = {}
    for match in MARKER.finditer(text):
        found.setdefault(match.group(1), []).append(match.group(2))
    for table_id, kinds in found.items():
        if f"table:{table_id}" not in contents:
            raise ClaimsError(
                f"{name}: <!-- table:{table_id}:... --> names no table of the registry"
            )
        if kinds != ["begin", "end"]:
            begin, end = markers(table_id)
            raise ClaimsError(
                f"{name}: table {table_id}: need one {begin} before one {end} "
                f"(found {', '.join(kinds)})"
            )
    for table_id in found:
        begin, end = markers(table_id)
        i, j = text.find(begin), text.find(end)
        text = text[: i + len(begin)] + "\n" + contents[f"table:{table_id}"] + "\n" + text[j:]
    return text, len(found)
