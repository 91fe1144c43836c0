"""The claims registry (``docs/reproductions/claims.yaml``): the papers' claims, where fedcomm's
per-seed numbers for each come from, and their verdicts by the rule of :mod:`.verdict`.

The file holds ``rule`` (``alpha``, ``last_k``), ``behaviours`` (claims about what an algorithm
does: each a paired comparison of two arms, decided over seeds, with its design in a
``protocol`` block: :mod:`.protocol`), ``diagnoses`` (the same form, for ablations and the
second readings of a claim: decided, never counted), ``checks`` (counts and
calibrated numbers: compared, never counted as reproduced behaviours) and ``untested`` (claims
that this machine cannot test at all, e.g. their dataset is not here: listed with what would
test them, never decided and never counted). Each arm reads one source:

- ``curves: <csv>`` + ``run`` [+ ``seeds``, ``at_round``]: a long curves table (``run``,
  ``seed``, ``round``, metric columns); final = mean of the last ``last_k`` evaluations; or
  [``within_gib`` (+ ``axis``, ``ended_inside``)] the best evaluation within a traffic cap;
- ``ablations: <key>`` [+ ``field``]: per-seed final records of ``issue15_ablations.json``
  (beside the claims file); final = the last evaluation (the curve was not kept);
- ``per_seed: {seed: value}`` with ``from``: explicit numbers and where they come from;
- ``pending: <what must run>`` [+ ``old``]: no per-seed data yet (verdict "pending");

and may subtract a second source per seed (``minus: {<source>}``). Paths are relative to the
claims file. The schema is strict: an unknown key or a bad value is a :class:`ClaimsError`
naming the file, the entry's id and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from fedcomm.errors import InputError, one_line
from fedcomm.evaluation.caps import CapAxis
from fedcomm.evaluation.curve_points import LAST_K
from fedcomm.reporting.paper_table_schema import Column, PaperTable, Row
from fedcomm.reporting.papers import Paper
from fedcomm.reporting.protocol import Protocol, check_arms
from fedcomm.reporting.verdict import Sign

ABLATIONS_FILE = "issue15_ablations.json"
SettledBy = Literal["experiment", "corrected verdict"]
SOURCE_KINDS = ("curves", "ablations", "per_seed", "pending")


class ClaimsError(InputError, ValueError):
    """The claims file, or a file it points to, is invalid; one line naming the id and key."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Rule(_Strict):
    alpha: float = Field(0.05, gt=0.0, lt=0.5)
    last_k: int = Field(LAST_K, ge=1)


class Source(_Strict):
    """Where one arm's per-seed numbers come from (exactly one of :data:`SOURCE_KINDS`)."""

    label: str | None = None
    curves: str | None = None
    run: str | None = None
    seeds: list[int] | None = None
    at_round: int | None = Field(None, ge=0)
    within_gib: float | None = Field(None, gt=0.0)  # best within a traffic cap instead of final
    axis: CapAxis | None = None  # what within_gib counts (default up_down: up + download)
    # a seed whose (finished) run ended inside the cap counts its best: a lower bound of its best
    # within the cap; without it such a seed is left out (it may be a run still training)
    ended_inside: Literal["best"] | None = None
    ablations: str | None = None
    field: str | None = None
    per_seed: dict[int, float] | None = None
    from_: str | None = Field(None, alias="from")
    pending: str | None = None
    old: str | None = None
    minus: Source | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Source:
        kinds = [k for k in SOURCE_KINDS if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(
                f"needs exactly one of {', '.join(SOURCE_KINDS)} (got {kinds or 'none'})"
            )
        allowed = {
            "curves": {"run", "seeds", "at_round", "within_gib", "axis", "ended_inside"},
            "ablations": {"field", "seeds"},
            "per_seed": {"from_"},
            "pending": {"old"},
        }[kinds[0]]
        keys = ("run", "seeds", "at_round", "within_gib", "axis", "ended_inside", "field")
        for key in (*keys, "from_", "old"):
            if getattr(self, key) is not None and key not in allowed:
                raise ValueError(f"`{key.rstrip('_')}` does not go with `{kinds[0]}`")
        for key in ("axis", "ended_inside"):
            if getattr(self, key) is not None and self.within_gib is None:
                raise ValueError(f"`{key}` goes with `within_gib` (the cap it counts)")
        if self.within_gib is not None and self.at_round is not None:
            raise ValueError("`within_gib` and `at_round` exclude each other")
        if kinds[0] == "curves" and self.run is None:
            raise ValueError("`curves` needs `run` (the run label in the table)")
        if kinds[0] == "per_seed" and not self.from_:
            raise ValueError("`per_seed` needs `from` (where the numbers come from)")
        if self.minus is not None and self.minus.label is not None:
            raise ValueError("`minus` takes no `label`")
        return self

    @property
    def kind(self) -> str:
        return next(k for k in SOURCE_KINDS if getattr(self, k) is not None)


def _text(value: Any) -> Any:
    """YAML reads ``+0.14`` or ``97.5`` as numbers; the registry keeps what was written."""
    return str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


class Behaviour(_Strict):
    id: str = Field(pattern=r"^[a-z0-9-]+$")
    paper: Paper
    page: str
    claim: str
    paper_value: str
    metric: str
    scale: float = Field(1.0, gt=0.0)
    direction: Sign
    margin: float = 0.0
    a: Source
    b: Source
    setting: str
    protocol: Protocol
    headline: bool = False  # one of the paper's headline method claims (README, per paper)
    note: str = ""
    settled_by: SettledBy | None = None

    _as_text = field_validator("paper_value", mode="before")(_text)

    @field_validator("a", "b")
    @classmethod
    def _labelled(cls, arm: Source) -> Source:
        if arm.label is None:
            raise ValueError("an arm needs a `label`")
        return arm

    @model_validator(mode="after")
    def _measures_what_it_states(self) -> Behaviour:
        check_arms(self.protocol, self.a, self.b)
        return self


class Check(_Strict):
    id: str = Field(pattern=r"^[a-z0-9-]+$")
    paper: Paper
    page: str
    what: str
    kind: Literal["count", "calibrated"]
    paper_value: str
    fedcomm_value: str
    agrees: bool
    note: str = ""
    settled_by: SettledBy | None = None

    _as_text = field_validator("paper_value", "fedcomm_value", mode="before")(_text)


class Untested(_Strict):
    """A claim that cannot be tested here (``needs``: what would test it: a dataset that is not
    on this machine, an accelerator). It has no verdict and is not a behaviour of the headline;
    a claim that only waits for runs stays a behaviour with ``pending`` arms."""

    id: str = Field(pattern=r"^[a-z0-9-]+$")
    paper: Paper
    page: str
    claim: str
    paper_value: str
    setting: str
    needs: str = Field(min_length=1)
    note: str = ""

    _as_text = field_validator("paper_value", mode="before")(_text)


SECTIONS: dict[str, type[BaseModel]] = {
    "behaviours": Behaviour,
    "diagnoses": Behaviour,
    "checks": Check,
    "untested": Untested,
    "tables": PaperTable,  # a paper's table beside fedcomm's numbers (paper_tables.py)
}


@dataclass(frozen=True)
class Registry:
    """A validated claims file; ``root`` is its folder (paths inside are relative to it)."""

    path: Path
    rule: Rule
    behaviours: tuple[Behaviour, ...]
    checks: tuple[Check, ...]
    untested: tuple[Untested, ...] = ()
    diagnoses: tuple[Behaviour, ...] = ()  # decided like behaviours, never in the headline
    tables: tuple[PaperTable, ...] = ()

    @property
    def root(self) -> Path:
        return self.path.parent


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(p) for p in loc) or "<entry>"


def _keys(model: type[BaseModel]) -> str:
    return ", ".join(f.alias or name for name, f in model.model_fields.items())


def _entry_error(
    path: Path, section: str, index: int, raw: Any, err: ValidationError, model: type[BaseModel]
) -> str:
    ident = raw.get("id") if isinstance(raw, dict) else None
    who = f"{section}[{index}]" + (f" (id {ident})" if ident else "")
    first = err.errors()[0]
    key = _where(first["loc"])
    if first["type"] == "extra_forbidden":
        nested: dict[str, type[BaseModel]] = {"protocol": Protocol, "columns": Column, "rows": Row}
        inner = nested.get(str(first["loc"][0]), Source)
        what = f"unknown key (allowed: {_keys(inner if len(first['loc']) > 1 else model)})"
    else:
        what = first["msg"].removeprefix("Value error, ")
        shown = first.get("input")
        if first["type"] != "missing" and not isinstance(shown, dict | list):
            what += f" (got {shown!r})"[:160]
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{path}: {who}: {key}: {what}{more}"


def load_registry(path: Path) -> Registry:
    """Read and validate a claims file; :class:`ClaimsError` (one line) if it is invalid."""
    if not path.is_file():
        raise ClaimsError(f"{path}: no such claims file")
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ClaimsError(f"{path}: not valid YAML ({one_line(err)})") from None
    if not isinstance(doc, dict):
        raise ClaimsError(f"{path}: expected a mapping with rule, behaviours, checks[, untested]")
    unknown = sorted(set(doc) - {"rule", *SECTIONS})
    if unknown:
        raise ClaimsError(
            f"{path}: unknown top-level key(s) {unknown} (allowed: rule, {', '.join(SECTIONS)})"
        )
    try:
        rule = Rule.model_validate(doc.get("rule") or {})
    except ValidationError as err:
        raise ClaimsError(
            _entry_error(path, "rule", 0, {}, err, Rule).replace("rule[0]", "rule")
        ) from None
    entries: dict[str, list[Any]] = {}
    for section, model in SECTIONS.items():
        raw_list = doc.get(section) or []
        if not isinstance(raw_list, list):
            raise ClaimsError(f"{path}: `{section}` must be a list of entries")
        out = []
        for i, raw in enumerate(raw_list):
            try:
                out.append(model.model_validate(raw))
            except ValidationError as err:
                raise ClaimsError(_entry_error(path, section, i, raw, err, model)) from None
        entries[section] = out
    seen: set[str] = set()
    for entry in [e for section in SECTIONS for e in entries[section]]:
        if entry.id in seen:
            raise ClaimsError(f"{path}: id {entry.id}: used twice (ids must be unique)")
        seen.add(entry.id)
        if not (path.parent / entry.page).is_file():
            raise ClaimsError(
                f"{path}: id {entry.id}: page: {entry.page!r} is not a file beside it"
            )
    return Registry(
        path,
        rule,
        tuple(entries["behaviours"]),
        tuple(entries["checks"]),
        tuple(entries["untested"]),
        tuple(entries["diagnoses"]),
        tuple(entries["tables"]),
    )
