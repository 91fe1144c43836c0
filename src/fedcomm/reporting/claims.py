"""The claims registry decided: each arm's per-seed values (:mod:`.sources`), each behaviour's
and diagnosis's paired comparison and verdict by the rule of :mod:`.verdict` under its
protocol (:mod:`.protocol`: n, group-sequential looks, the sensitivity mark), after every
registration is checked against git (:mod:`.registration`). The file format and its validation
are :mod:`.claims_schema` (re-exported here: ``load_registry``, ``Registry``, ``ClaimsError``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from fedcomm.reporting.claims_schema import (
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
from fedcomm.reporting.sources import ArmValues, Files, resolve
from fedcomm.reporting.verdict import PENDING, REPRODUCED, Paired, paired

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
    beh: Behaviour, rule: Rule, files: Files, where: str, variant: Variant | None = None
) -> tuple[ArmValues, ArmValues, Paired | None, str]:
    """The arms and their paired comparison under the claim's protocol (``variant``: one
    neighbouring choice); the last item says why a comparison is still pending."""
    if variant is not None:
        rule = rule.model_copy(update={"last_k": variant.last_k or rule.last_k})
        a_src, b_src = _shifted(beh.a, variant), _shifted(beh.b, variant)
    else:
        a_src, b_src = beh.a, beh.b
    a = resolve(a_src, beh.metric, rule, files, f"{where}: a")
    b = resolve(b_src, beh.metric, rule, files, f"{where}: b")
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
        bounds = sequential_bounds(looks, beh.protocol.alpha(rule.alpha), beh.protocol.spending)
        bound = bounds[looks.index(m)]
    result = paired(
        a.values,
        b.values,
        direction=beh.direction,
        margin=beh.margin,
        alpha=beh.protocol.alpha(rule.alpha),
        scale=beh.scale,
        t_crit=bound,
    )
    if m not in looks:
        return a, b, replace(result, verdict=PENDING), f"{m} of {looks[-1]} seeds"
    if m < looks[-1] and result.verdict != REPRODUCED:  # an interim look only stops to reproduce
        return a, b, replace(result, verdict=PENDING), f"look {looks.index(m) + 1}: {m} seeds"
    return a, b, result, ""


def _sensitivity(beh: Behaviour, verdict: str, rule: Rule, files: Files, where: str) -> str:
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
    files = Files(registry.root)
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
