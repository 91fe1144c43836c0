"""``evaluate``: summaries over a finished run (budgets, caps, targets, the link model)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from fedcomm.config.base import Strict
from fedcomm.evaluation.caps import CapAxis
from fedcomm.evaluation.curve_points import LAST_K


class LinkConfig(Strict):
    down_mbps: float = Field(110.6, gt=0)
    up_mbps: float = Field(14.0, gt=0)


class EvaluateConfig(Strict):
    """``evaluate``: summaries over a finished run."""

    budgets_gib: list[Annotated[float, Field(gt=0)]] = Field(default_factory=list)
    upload_caps_gib: list[Annotated[float, Field(gt=0)]] = Field(
        default_factory=list,
        description="FedDST upload caps: best global accuracy within each cumulative traffic "
        "cap on upload_cap_axis (GiB)",
    )
    upload_cap_axis: CapAxis = Field(
        "up_down",
        description="what upload_caps_gib count: up_down = cumulative upload + download of all "
        "clients (the reading that reproduces FedDST's Table 1 FedAvgM row, "
        "docs/reproductions/audit/feddst.md); up = cumulative upload only",
    )
    targets: list[Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=list)
    time_budgets_h: list[Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default_factory=list,
        description="simulated-time budgets (hours, runs with a system section): best accuracy "
        "over the evaluations whose time/sim_elapsed_s is within each, the rule of budgets_gib",
    )
    link: LinkConfig = Field(default_factory=LinkConfig)
    last_k: int = Field(
        LAST_K,
        ge=1,
        description="final accuracy (and loss) = the mean of each run's last k evaluations: "
        "metrics.json, summary.md, fedcomm report and sweeps alike (the decision rule's last_k)",
    )
    metric: Literal["global/accuracy", "topk/accuracy"] = Field(
        "global/accuracy",
        description="the accuracy budgets, caps and targets refer to (topk: train.topk, e.g. "
        "FedBIAD's top-3 next-word accuracy)",
    )
