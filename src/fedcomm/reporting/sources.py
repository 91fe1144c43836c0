"""Where each arm's per-seed values come from: a curves CSV (or a glob of per-seed CSVs) read
once, the final of each seed or its best within a traffic cap, the typed records of the
ablations JSON or a page, pending; and ``minus`` per seed. The claims file's schema is
:mod:`.claims_schema`; deciding the claims is :mod:`.claims`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from fedcomm.errors import one_line
from fedcomm.evaluation.caps import CAP_AXIS_WORDS, CapAxis, curves_at_caps
from fedcomm.reporting.claims_schema import ABLATIONS_FILE, ClaimsError, Rule, Source
from fedcomm.reporting.verdict import final_per_seed


@dataclass(frozen=True)
class ArmValues:
    """One arm's per-seed values (``None`` when pending) and how "final" was taken."""

    values: dict[int, float] | None
    final: str  # e.g. "mean of last 5 evaluations", "last evaluation", "given"


class Files:
    """The CSVs and the ablations JSON a registry reads, each loaded once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._curves: dict[str, pl.DataFrame] = {}
        self._ablations: dict[str, Any] | None = None

    def curves(self, rel: str, where: str) -> pl.DataFrame:
        """One CSV, or every CSV a glob names (``data/abl_x_s*.csv``: the per-seed files of
        ``pipeline/per_seed.sh``) stacked; each must have ``run``, ``seed`` and ``round``."""
        if rel not in self._curves:
            files = sorted(self.root.glob(rel)) if any(c in rel for c in "*?[") else []
            if not files:
                files = [self.root / rel]
            frames = [self._one_csv(file, where) for file in files]
            self._curves[rel] = pl.concat(frames, how="diagonal_relaxed")
        return self._curves[rel]

    @staticmethod
    def _one_csv(file: Path, where: str) -> pl.DataFrame:
        if not file.is_file():
            raise ClaimsError(f"{where}.curves: {file}: no such file")
        try:
            frame = pl.read_csv(file, infer_schema_length=None)
        except Exception as err:  # polars raises several types for a damaged CSV
            raise ClaimsError(f"{where}.curves: {file}: unreadable ({one_line(err)})") from None
        missing = [c for c in ("run", "seed", "round") if c not in frame.columns]
        if missing:
            raise ClaimsError(f"{where}.curves: {file}: lacks column(s) {missing}")
        return frame.with_columns(pl.col("run").cast(pl.String))

    def ablations(self, where: str) -> dict[str, Any]:
        if self._ablations is None:
            file = self.root / ABLATIONS_FILE
            try:
                runs = json.loads(file.read_text(encoding="utf-8"))["runs"]
            except (OSError, ValueError, KeyError, TypeError) as err:
                raise ClaimsError(
                    f"{where}.ablations: {file}: unreadable ({one_line(err)})"
                ) from None
            self._ablations = runs
        return self._ablations


def column_named(columns: list[str], metric: str) -> str | None:
    """``metric`` or the column it names with '/' written '_' (``global/accuracy``)."""
    for c in columns:
        if c == metric or c.replace("/", "_") == metric.replace("/", "_"):
            return c
    return None


def resolve(src: Source, metric: str, rule: Rule, files: Files, where: str) -> ArmValues:
    if src.pending is not None:
        base = ArmValues(None, "pending")
    elif src.per_seed is not None:
        base = ArmValues(dict(src.per_seed), f"given ({src.from_})")
    elif src.ablations is not None:
        records = files.ablations(where).get(src.ablations)
        if not isinstance(records, list):
            raise ClaimsError(f"{where}.ablations: no key {src.ablations!r} in {ABLATIONS_FILE}")
        values = {}
        for rec in records:
            key = column_named(list(rec), src.field or metric)
            if key is None:
                raise ClaimsError(
                    f"{where}.field: {src.field or metric!r} not in the records of "
                    f"{src.ablations!r} (has {sorted(k for k in rec if k != 'seed')})"
                )
            if rec[key] is not None and (src.seeds is None or rec["seed"] in src.seeds):
                values[int(rec["seed"])] = float(rec[key])
        base = ArmValues(values, "last evaluation")
    else:
        assert src.curves is not None and src.run is not None
        frame = files.curves(src.curves, where)
        col = column_named(frame.columns, metric)
        if col is None:
            raise ClaimsError(f"{where}.curves: {src.curves} has no column {metric!r}")
        if src.run not in set(frame["run"]):
            raise ClaimsError(f"{where}.run: {src.run!r} is not a run of {src.curves}")
        if src.within_gib is not None:
            return _with_minus(_best_within(frame, src, col), src, metric, rule, files, where)
        finals = final_per_seed(
            frame, src.run, col, last_k=rule.last_k, seeds=src.seeds, at_round=src.at_round
        )
        k = finals.k
        final = "last evaluation" if k == 1 else f"mean of last {k} evaluations"
        if finals.fewest < k:
            final += f" (fewest available: {finals.fewest})"
        base = ArmValues(finals.values, final)
    return _with_minus(base, src, metric, rule, files, where)


def _best_within(frame: pl.DataFrame, src: Source, col: str) -> ArmValues:
    """Per seed: the best ``col`` over the evaluations within ``src.within_gib`` GiB of traffic
    on ``src.axis`` (FedDST's upload caps, budgets); a seed with no evaluation inside is left
    out, and so is one whose curve does not go past the cap unless ``src.ended_inside`` says
    the run finished there (then its best, a lower bound of its best within the cap, counts).
    Reads the summarize stage's ``cum_*`` columns and ``fedcomm curves``' ``comm_cum_*``."""
    assert src.within_gib is not None
    axis: CapAxis = src.axis or "up_down"
    run = frame.filter(pl.col("run") == src.run)
    table = curves_at_caps(run, col, [src.within_gib], axis)
    # only curves that go past the cap have a final best within it (a run that ended, or is
    # still training, inside the cap has a best so far): the other seeds are left out
    values = {
        int(r["seed"]): float(r["best"])
        for r in table.iter_rows(named=True)
        if r["best"] is not None
        and (r["passed"] or src.ended_inside is not None)
        and (src.seeds is None or r["seed"] in src.seeds)
    }
    inside = "; a run that ended inside it: its best" if src.ended_inside is not None else ""
    return ArmValues(values, f"best within {src.within_gib:g} GiB ({CAP_AXIS_WORDS[axis]}{inside})")


def _with_minus(
    base: ArmValues, src: Source, metric: str, rule: Rule, files: Files, where: str
) -> ArmValues:
    if src.minus is None:
        return base
    minus = resolve(src.minus, metric, rule, files, f"{where}.minus")
    if base.values is None or minus.values is None:
        return ArmValues(None, "pending")
    common = sorted(set(base.values) & set(minus.values))
    final = base.final if base.final == minus.final else f"{base.final} − {minus.final}"
    return ArmValues({s: base.values[s] - minus.values[s] for s in common}, final)
