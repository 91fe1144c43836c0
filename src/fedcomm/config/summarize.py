"""``summarize``: the report over every run and seed, and its paired comparisons; the curve
columns the summarize stage keeps (``CURVE_COLUMNS``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from fedcomm.config.base import Strict

# the rounds columns the summarize stage's curves (reports/curves.csv) keep, and their names there
CURVE_COLUMNS = {
    "round": "round",
    "comm/cum_gib": "cum_gib",
    "comm/cum_up_bytes": "cum_up_bytes",
    "global/accuracy": "global_accuracy",
    "local/accuracy": "local_accuracy",
    "topk/accuracy": "topk_accuracy",
    "global/loss": "global_loss",
    "model/sparsity": "model_sparsity",
    "time/sim_elapsed_s": "sim_elapsed_s",  # simulated seconds (runs with a system section only)
    "energy/cum_j": "energy_cum_j",  # the clients' joules so far (system.energy only)
}
POINTS_METRICS = ("global_accuracy", "local_accuracy", "topk_accuracy", "model_sparsity")


class PairedConfig(Strict):
    """One ``summarize.paired`` comparison: ``d = a − b`` per seed of a curve's final value (the
    mean of its last ``evaluate.last_k`` evaluations), decided by the one-sided paired t rule
    (``a − b > margin`` for ``greater``, ``< margin`` for ``less``; 95%, t at n − 1 df)."""

    a: str
    b: str
    metric: str = "global_accuracy"
    direction: Literal["greater", "less"] = "greater"
    margin: float = Field(0.0, description="in shown units (points for accuracies, sparsity)")
    scale: float | None = Field(
        None, gt=0, description="d is shown x scale; null: 100 (points) for accuracies, else 1"
    )

    @field_validator("metric")
    @classmethod
    def _known_curve(cls, metric: str) -> str:
        allowed = [c for c in CURVE_COLUMNS.values() if c != "round"]
        if metric not in allowed:
            raise ValueError(f"{metric!r} is not a curve column (allowed: {allowed})")
        return metric

    @model_validator(mode="after")
    def _two_runs(self) -> PairedConfig:
        if self.a == self.b:
            raise ValueError(f"a and b are the same run ({self.a!r})")
        return self

    @property
    def shown_scale(self) -> float:
        if self.scale is not None:
            return self.scale
        return 100.0 if self.metric in POINTS_METRICS else 1.0


class SummarizeConfig(Strict):
    title: str = "fedcomm experiment"

    @model_validator(mode="before")
    @classmethod
    def _last_k_moved(cls, data: Any) -> Any:
        if isinstance(data, dict) and "last_k" in data:
            raise ValueError(
                "last_k moved to evaluate.last_k (one meaning of a final accuracy in "
                f"metrics.json, summary.md, fedcomm report and sweeps): set evaluate.last_k: "
                f"{data['last_k']!r} instead"
            )
        return data

    paired: list[PairedConfig] = Field(
        default_factory=list, description="paired comparisons over seeds (the decision rule)"
    )
