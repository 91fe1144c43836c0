"""The claims registry decided: each arm's per-seed values read from its source (curves CSV,
ablations JSON, explicit numbers, pending; ``minus`` per seed), and each behaviour's paired
comparison and verdict by the rule of :mod:`.verdict`. The file format and its validation are
:mod:`.claims_schema` (re-exported here: ``load_registry``, ``Registry``, ``ClaimsError``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import polars as pl

from fedcomm.errors import one_line
from fedcomm.evaluation.caps import CAP_AXIS_WORDS, CapAxis, curves_at_caps
from fedcomm.reporting.claims_schema import (
    ABLATIONS_FILE,
    Behaviour,
    ClaimsError,
    Registry,
    Rule,
    Source,
    load_registry,
)
from fedcomm.reporting.protocol import Standing, Variant, standing, typed, variants
from fedcomm.reporting.registration import check_registration, data_files, repo_top
from fedcomm.reporting.sequential import sequential_bounds
from fedcomm.reporting.verdict import PENDING, REPRODUCED, Paired, final_per_seed, paired

__all__ = [
    "ArmValues",
    "ClaimsError",
    "Decided",
    "Registry",
    "decide",
    "load_registry",
    "verdicts_json",
]


@dataclass(frozen=True)
class ArmValues:
    """One arm's per-seed values (``None`` when pending) and how "final" was taken."""

    values: dict[int, float] | None
    final: str  # e.g. "mean of last 5 evaluations", "last evaluation", "given"


class _Files:
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


def _column(columns: list[str], metric: str) -> str | None:
    """``metric`` or the column it names with '/' written '_' (``global/accuracy``)."""
    for c in columns:
        if c == metric or c.replace("/", "_") == metric.replace("/", "_"):
            return c
    return None


def _resolve(src: Source, metric: str, rule: Rule, files: _Files, where: str) -> ArmValues:
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
            key = _column(list(rec), src.field or metric)
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
        col = _column(frame.columns, metric)
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
    base: ArmValues, src: Source, metric: str, rule: Rule, files: _Files, where: str
) -> ArmValues:
    if src.minus is None:
        return base
    minus = _resolve(src.minus, metric, rule, files, f"{where}.minus")
    if base.values is None or minus.values is None:
        return ArmValues(None, "pending")
    common = sorted(set(base.values) & set(minus.values))
    final = base.final if base.final == minus.final else f"{base.final} − {minus.final}"
    return ArmValues({s: base.values[s] - minus.values[s] for s in common}, final)


@dataclass(frozen=True)
class Decided:
    """A behaviour (or diagnosis) with its arms' values, its verdict (``paired`` None when
    pending), whether it counts in the headline, and its sensitivity mark."""

    behaviour: Behaviour
    a: ArmValues
    b: ArmValues
    paired: Paired | None
    section: str = "behaviours"
    standing: Standing = field(default_factory=lambda: Standing(()))
    sensitivity: str = ""  # "robust", "fragile (…)", or "" when there is nothing to vary
    waiting: str = ""  # why a decided-looking row is still pending ("3 of 5 seeds")

    @property
    def verdict(self) -> str:
        return PENDING if self.paired is None else self.paired.verdict

    @property
    def final(self) -> str:
        a, b = self.a.final, self.b.final
        return a if a == b else f"{a} vs {b}"


def _shifted(src: Source, variant: Variant) -> Source:
    """``src`` under one neighbouring choice (its ``minus`` too)."""
    update: dict[str, Any] = {}
    if variant.cap_factor is not None and src.within_gib is not None:
        update["within_gib"] = src.within_gib * variant.cap_factor
    if variant.axis is not None and src.within_gib is not None:
        update["axis"] = variant.axis
    if variant.round_factor is not None and src.at_round is not None:
        update["at_round"] = round(src.at_round * variant.round_factor)
    if src.minus is not None:
        update["minus"] = _shifted(src.minus, variant)
    return src.model_copy(update=update)


def _compare(
    beh: Behaviour, rule: Rule, files: _Files, where: str, variant: Variant | None = None
) -> tuple[ArmValues, ArmValues, Paired | None, str]:
    """The arms and their paired comparison under the claim's protocol (``variant``: one
    neighbouring choice); the last item says why a comparison is still pending."""
    if variant is not None:
        rule = rule.model_copy(update={"last_k": variant.last_k or rule.last_k})
        a_src, b_src = _shifted(beh.a, variant), _shifted(beh.b, variant)
    else:
        a_src, b_src = beh.a, beh.b
    a = _resolve(a_src, beh.metric, rule, files, f"{where}: a")
    b = _resolve(b_src, beh.metric, rule, files, f"{where}: b")
    if a.values is None or b.values is None:
        return a, b, None, ""
    looks = beh.protocol.looks_or_n()
    m = len(set(a.values) & set(b.values))
    if m > looks[-1]:
        raise ClaimsError(
            f"{where}: the arms share {m} seeds, protocol.n is {looks[-1]} "
            "(pin the seeds of the design with `seeds`)"
        )
    bound = None
    if m in looks and beh.protocol.looks:
        bounds = sequential_bounds(looks, rule.alpha, beh.protocol.spending)
        bound = bounds[looks.index(m)]
    result = paired(
        a.values,
        b.values,
        direction=beh.direction,
        margin=beh.margin,
        alpha=rule.alpha,
        scale=beh.scale,
        t_crit=bound,
    )
    if m not in looks:
        return a, b, replace(result, verdict=PENDING), f"{m} of {looks[-1]} seeds"
    if m < looks[-1] and result.verdict != REPRODUCED:  # an interim look only stops to reproduce
        return a, b, replace(result, verdict=PENDING), f"look {looks.index(m) + 1}: {m} seeds"
    return a, b, result, ""


def _sensitivity(beh: Behaviour, verdict: str, rule: Rule, files: _Files, where: str) -> str:
    """``robust`` when every neighbouring choice that the data can decide gives the same
    verdict, else ``fragile`` and which choices change it; a choice the data cannot decide (a
    cap the curves never pass, an axis they do not record) is named, not counted. ``""`` when
    nothing can be varied yet (pending); typed per-seed finals cannot be varied at all."""
    if verdict == PENDING:
        return ""
    if typed(beh.a) or typed(beh.b):
        return "not computable (typed per-seed finals: no curves to vary)"
    flips, unknown = [], []
    for variant in variants(beh.protocol, rule.last_k):
        try:
            _, _, other, _ = _compare(beh, rule, files, where, variant)
        except ClaimsError:  # e.g. a column the variant needs is not in the curves
            other = None
        if other is None or other.verdict == PENDING:
            unknown.append(variant.what)
        elif other.verdict != verdict:
            flips.append(f"{variant.what}: {other.verdict}")
    if flips:
        return f"fragile ({'; '.join(flips)})"
    return "robust" + (f" (not decidable: {', '.join(unknown)})" if unknown else "")


def check_registrations(registry: Registry) -> None:
    """Refuse (:class:`ClaimsError`, every problem listed) a claim whose ``registered`` commit
    does not hold its current design, or is not older than every data file it reads
    (:mod:`.registration`). Needs git only when some claim names a commit."""
    entries = [b for b in (*registry.behaviours, *registry.diagnoses) if not b.protocol.after_data]
    if not entries:
        return
    top = repo_top(registry.root.resolve())
    claims_rel = registry.path.resolve().relative_to(top).as_posix()
    prefix = registry.root.resolve().relative_to(top).as_posix()
    problems = []
    for beh in entries:
        raw = beh.model_dump(by_alias=True, exclude_none=True)
        files = data_files(raw, registry.root, "" if prefix == "." else prefix)
        problems += check_registration(top, claims_rel, beh.id, beh.protocol.registered, raw, files)
    if problems:
        raise ClaimsError(
            f"{registry.path}: {len(problems)} registration problem(s) (a claim registered "
            "after its data is refused; write `registered: after-data` to keep it outside the "
            "headline): " + "; ".join(problems)
        )


def decide(registry: Registry) -> list[Decided]:
    """Every behaviour, then every diagnosis, of ``registry`` decided by the rule under its
    protocol (files read once), after :func:`check_registrations`."""
    check_registrations(registry)
    files = _Files(registry.root)
    out = []
    sections = (("behaviours", registry.behaviours), ("diagnoses", registry.diagnoses))
    for section, entries in sections:
        for beh in entries:
            where = f"{registry.path}: id {beh.id}"
            a, b, result, waiting = _compare(beh, registry.rule, files, where)
            verdict = PENDING if result is None else result.verdict
            mark = _sensitivity(beh, verdict, registry.rule, files, where)
            out.append(Decided(beh, a, b, result, section, standing(beh, section), mark, waiting))
    return out


def verdicts_json(registry: Registry, decided: list[Decided]) -> dict[str, Any]:
    """The registry's numbers for ``--json``: the rule, every behaviour's paired comparison and
    verdict, the checks and the claims not tested here."""
    behaviours: list[Mapping[str, Any]] = []
    for dec in decided:
        beh = dec.behaviour
        behaviours.append(
            {
                "id": beh.id,
                "paper": beh.paper,
                "claim": beh.claim,
                "metric": beh.metric,
                "scale": beh.scale,
                "a": beh.a.label,
                "b": beh.b.label,
                "final": dec.final,
                "verdict": dec.verdict,
                "paired": None if dec.paired is None else dec.paired.as_dict(),
                "settled_by": beh.settled_by,
                "section": dec.section,
                "counted": dec.standing.counted,
                "standing": dec.standing.text(),
                "sensitivity": dec.sensitivity,
                "protocol": beh.protocol.model_dump(),
                "headline": beh.headline,
            }
        )
    return {
        "rule": registry.rule.model_dump(),
        "behaviours": behaviours,
        "checks": [c.model_dump() for c in registry.checks],
        "untested": [u.model_dump() for u in registry.untested],
    }
