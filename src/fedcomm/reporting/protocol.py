"""Protocol v2 of the claims registry: each claim's design, fixed before its data.

A behaviour's ``protocol`` block states, before any of its data exists:

- ``n``: the seeds its verdict uses (the final look when there are several);
- ``looks``: a group-sequential design, e.g. ``[3, 5]``: the claim may be decided at 3 seeds
  and, if not, at 5, with the critical values of :func:`~.sequential.sequential_bounds`
  (alpha spent over the looks, so the overall type-I error stays at the rule's alpha);
- ``measure``: ``final`` (the mean of the rule's last k evaluations), ``best_within_cap`` (the
  best evaluation within ``cap_gib`` GiB on ``axis``, which a capped claim must state: ``up``,
  the upload alone, or ``up_down``) or ``at_round`` (the final at or before
  ``at_round``); the arms' sources must measure exactly that;
- ``chosen_among``: how many readings of an arm were compared on the same seeds before one was
  chosen for this claim (default 1: none). A choice made on the claim's own data is paid for in
  the statistics: the claim is tested at ``alpha / chosen_among`` (Bonferroni over the readings
  it could have taken). It is the one key that may be added after the registration: it only
  raises the threshold;
- ``registered``: the commit that fixed this design (checked against git by
  :mod:`.registration`: the design at that commit is the current one, and every data file the
  claim reads was added after it), or ``after-data``: an honest statement that the claim was
  written with or after its data. Such a claim is decided and shown, but never counted in the
  headline.

:func:`standing` says whether a decided behaviour counts in the headline, and if not why;
:func:`variants` lists the neighbouring choices of the sensitivity mark (robust / fragile).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal
from typing import Protocol as Structural

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedcomm.evaluation.caps import CapAxis


class Source(Structural):
    """What is read of an arm's source (``claims_schema.Source``, frozen: read-only)."""

    @property
    def pending(self) -> str | None: ...

    @property
    def within_gib(self) -> float | None: ...

    @property
    def axis(self) -> CapAxis | None: ...

    @property
    def at_round(self) -> int | None: ...

    @property
    def ablations(self) -> str | None: ...

    @property
    def per_seed(self) -> dict[int, float] | None: ...

    @property
    def minus(self) -> Any: ...  # Source | None


class Behaviour(Structural):
    """What is read of a behaviour (``claims_schema.Behaviour``)."""

    @property
    def protocol(self) -> Protocol: ...

    @property
    def a(self) -> Source: ...

    @property
    def b(self) -> Source: ...


Measure = Literal["final", "best_within_cap", "at_round"]
Spending = Literal["pocock", "obrien_fleming"]
AFTER_DATA = "after-data"
COMMIT = re.compile(r"^[0-9a-f]{7,40}$")

#: The sensitivity neighbourhood (fixed with protocol v2, before any re-decision): the rule's
#: last k against these; a cap against these multiples and the other axis (upload alone, or
#: upload + download); a round against these multiples.
LAST_K_NEIGHBOURS = (3, 10)
CAP_FACTORS = (0.8, 1.25)
ROUND_FACTORS = (0.9, 1.1)


class Protocol(BaseModel):
    """A claim's design (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(ge=3)
    looks: list[int] | None = None
    spending: Spending = "pocock"
    measure: Measure
    cap_gib: float | None = Field(None, gt=0.0)
    axis: CapAxis | None = None
    at_round: list[int] | None = None
    chosen_among: int = Field(1, ge=1)
    registered: str

    @model_validator(mode="after")
    def _coherent(self) -> Protocol:
        if self.registered != AFTER_DATA and not COMMIT.match(self.registered):
            raise ValueError(
                f"registered: a commit hash (7-40 hex digits) or {AFTER_DATA!r} "
                f"(got {self.registered!r})"
            )
        if self.looks is not None:
            pairs = zip(self.looks, self.looks[1:], strict=False)
            ok = len(self.looks) >= 2 and all(b > a for a, b in pairs)
            if not ok or self.looks[0] < 3 or self.looks[-1] != self.n:
                raise ValueError(
                    f"looks: at least two, increasing, from 3 seeds, the last equal to n = "
                    f"{self.n} (got {self.looks})"
                )
        capped = self.measure == "best_within_cap"
        if capped != (self.cap_gib is not None) or (self.axis is not None and not capped):
            raise ValueError("cap_gib (and axis) go with measure best_within_cap, and only with it")
        if capped and self.axis is None:
            raise ValueError(
                "axis: a capped measure states its traffic axis (up: the upload alone, or "
                "up_down: upload + download)"
            )
        if (self.measure == "at_round") != bool(self.at_round):
            raise ValueError("at_round (a list of rounds) goes with measure at_round, and only it")
        return self

    @property
    def after_data(self) -> bool:
        return self.registered == AFTER_DATA

    def looks_or_n(self) -> tuple[int, ...]:
        return tuple(self.looks) if self.looks else (self.n,)

    def alpha(self, rule_alpha: float) -> float:
        """The level this claim is tested at: the rule's, shared among ``chosen_among``
        readings (Bonferroni)."""
        return rule_alpha / self.chosen_among


def check_arms(protocol: Protocol, a: Source, b: Source) -> None:
    """ValueError unless the arms measure what ``protocol`` states (typed and pending arms
    measure "final": a typed record is a final, a pending arm has no data yet)."""
    arms = {"a": a, "b": b}
    if protocol.measure == "best_within_cap":
        axis = protocol.axis
        for name, arm in arms.items():
            if arm.pending is not None:
                continue
            if arm.within_gib != protocol.cap_gib or (arm.axis or "up_down") != axis:
                raise ValueError(
                    f"{name}: measures within {arm.within_gib} GiB ({arm.axis or 'up_down'}), "
                    f"protocol: best_within_cap {protocol.cap_gib} GiB ({axis})"
                )
        return
    for name, arm in arms.items():
        if arm.within_gib is not None:
            raise ValueError(f"{name}: has within_gib, protocol measure is {protocol.measure}")
    if protocol.measure == "at_round":
        rounds = {arm.at_round for arm in arms.values() if arm.at_round is not None}
        rounds |= {
            arm.minus.at_round
            for arm in arms.values()
            if arm.minus is not None and arm.minus.at_round is not None
        }
        if rounds != set(protocol.at_round or ()):
            raise ValueError(
                f"the arms measure at rounds {sorted(rounds)}, protocol.at_round is "
                f"{protocol.at_round}"
            )
    elif any(arm.at_round is not None for arm in arms.values()):
        raise ValueError("an arm has at_round, protocol measure is final")


def typed(src: Source) -> bool:
    """Whether ``src`` (or its ``minus``) reads numbers typed into a file, not curves."""
    here = src.ablations is not None or src.per_seed is not None
    return here or (src.minus is not None and typed(src.minus))


@dataclass(frozen=True)
class Standing:
    """Whether a behaviour counts in the headline; ``reasons`` say why not."""

    reasons: tuple[str, ...]

    @property
    def counted(self) -> bool:
        return not self.reasons

    def text(self) -> str:
        return "counted" if self.counted else "outside the headline: " + "; ".join(self.reasons)


def standing(beh: Behaviour, section: str) -> Standing:
    """A behaviour counts when it is a behaviour (not a diagnosis), its registration precedes
    its data (checked elsewhere: a false registration is refused before this is asked) and its
    numbers come from committed curves."""
    reasons = []
    if section == "diagnoses":
        reasons.append("a diagnosis")
    if beh.protocol.after_data:
        reasons.append("registered after its data")
    if typed(beh.a) or typed(beh.b):
        reasons.append("typed per-seed numbers")
    return Standing(tuple(reasons))


@dataclass(frozen=True)
class Variant:
    """One neighbouring choice: ``what`` it changes, and the change (rule's k, cap, round)."""

    what: str
    last_k: int | None = None
    cap_factor: float | None = None
    round_factor: float | None = None
    axis: CapAxis | None = None


def variants(protocol: Protocol, last_k: int) -> Iterator[Variant]:
    """The neighbouring choices of the sensitivity mark: the "last k" of a final, the caps and
    the other traffic axis of a capped measure, the rounds of an at-round measure (each one
    change)."""
    if protocol.measure == "best_within_cap":
        for f in CAP_FACTORS:
            yield Variant(f"cap x{f:g}", cap_factor=f)
        other: CapAxis = "up" if protocol.axis == "up_down" else "up_down"
        yield Variant(f"axis {other}", axis=other)
        return
    for k in LAST_K_NEIGHBOURS:
        if k != last_k:
            yield Variant(f"last {k}", last_k=k)
    if protocol.measure == "at_round":
        for f in ROUND_FACTORS:
            yield Variant(f"round x{f:g}", round_factor=f)
