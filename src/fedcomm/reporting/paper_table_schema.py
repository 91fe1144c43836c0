"""The ``tables`` section of the claims registry: a paper's table beside fedcomm's numbers,
computed from committed curves (never typed). Rendering is :mod:`.paper_tables`."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fedcomm.evaluation.caps import CapAxis
from fedcomm.reporting.papers import Paper


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Column(_Strict):
    """One measured column: ``metric`` of the curves, per seed ``final`` (the mean of the rule's
    last k evaluations, as a verdict takes it), ``last`` (the last evaluation: cumulative
    counters such as ``comm_cum_gib``) or, with ``within_gib``, the best evaluation within that
    much traffic on ``axis`` (a paper's accuracy at a traffic cap, as a capped claim measures
    it), times ``scale``, shown with ``digits`` decimals."""

    metric: str
    label: str
    at: Literal["final", "last"] = "final"
    within_gib: float | None = Field(None, gt=0.0)
    axis: CapAxis | None = None
    scale: float = Field(1.0, gt=0.0)
    digits: int = Field(2, ge=0, le=6)

    @model_validator(mode="after")
    def _capped(self) -> Column:
        if (self.within_gib is None) != (self.axis is None):
            raise ValueError("within_gib and axis go together (a cap states its traffic axis)")
        if self.within_gib is not None and self.at != "final":
            raise ValueError("at: a capped column takes the best within the cap, not 'last'")
        return self


class Row(_Strict):
    """One run of the curves, its label, and the paper's numbers for it (as the paper prints
    them: text, beside the measured columns); ``curves`` when this run's are in other files
    than the table's."""

    run: str
    label: str
    paper: str = ""
    curves: str | None = None


class PaperTable(_Strict):
    """A paper's table and fedcomm's runs of it: mean ± standard error over ``seeds`` of each
    column, from the curves ``curves`` (a CSV or a glob of per-seed CSVs, relative to the claims
    file). A run with fewer of the seeds shows its mean over the seeds it has, and says how
    many; a run not in the curves yet is pending."""

    id: str = Field(pattern=r"^[a-z0-9-]+$")
    paper: Paper
    page: str
    title: str
    curves: str
    seeds: list[int] = Field(min_length=1)
    columns: list[Column] = Field(min_length=1)
    rows: list[Row] = Field(min_length=1)
    paper_header: str
    note: str = ""

    @model_validator(mode="after")
    def _unique(self) -> PaperTable:
        runs = [r.run for r in self.rows]
        if len(set(runs)) != len(runs):
            raise ValueError(f"rows: each run once (got {runs})")
        if len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds: each seed once (got {self.seeds})")
        return self
