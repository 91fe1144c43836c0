"""A run's headline numbers: the few that ``runs/<run>-s<seed>/metrics.json`` holds for
``dvc metrics show`` / ``dvc exp show`` and that MLflow's runs table shows as columns. Everything
else of the run's summary (:func:`~fedcomm.evaluation.summaries.summarize_run`) stays in
``summary.json``, which is not a DVC metric.

Keys (flat, so a terminal of 200 columns holds a default experiment's table):

- ``final_acc``: the final of ``evaluate.metric`` (global accuracy, or top-k for next-word
  prediction), the mean of the last ``evaluate.last_k`` evaluations; ``final_local_acc`` the same
  of local accuracy (each client's last upload on its own test split);
- ``up_gib`` / ``down_gib``: all traffic of the run, upload and download (GiB, 2^30 bytes);
- ``save_x``: dense end-to-end FedAvg's traffic over this run's (both directions, the dense model
  down and up for each sampled client and round): 2.0 = half the bytes;
- ``gib_to_<t>``: GiB (up + down) until ``evaluate.metric`` first reached target ``t``; null if it
  never did;
- ``sim_h``: simulated hours of the run (runs with a ``train.system`` section only);
- ``energy_j``: the joules its clients spent (runs with ``train.system.energy`` only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from fedcomm.evaluation.curve_points import json_key

HEADLINE_KEYS = ("final_acc", "final_local_acc", "up_gib", "down_gib", "save_x")


def final_keys(metric: str) -> dict[str, str]:
    """The headline numbers read off a summary's ``final`` section: ``{headline key: its key
    there}`` (``final_acc`` is ``metric``'s, ``evaluate.metric``); a run's (:func:`run_headline`)
    and the summarize stage's means over seeds (its MLflow summary run)."""
    return {
        "final_acc": metric,
        "final_local_acc": "local/accuracy",
        "up_gib": "comm/up_gib",
        "down_gib": "comm/down_gib",
    }


def _get(summary: Mapping[str, Any], *path: str) -> Any:
    node: Any = summary
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


def run_headline(
    summary: Mapping[str, Any], *, metric: str, targets: Sequence[float] = ()
) -> dict[str, float | None]:
    """The headline numbers of one run's ``summary`` (nested, as ``summary.json``).

    Args:
        summary: the run's summary (``final``, ``to_target``, ``comm``; ``sim`` when on).
        metric: ``evaluate.metric`` (``global/accuracy`` or ``topk/accuracy``).
        targets: ``evaluate.targets``, in [0, 1].
    """
    cost = _get(summary, "comm", "cost_vs_dense_e2e")
    out: dict[str, float | None] = {
        name: _get(summary, "final", key) for name, key in final_keys(metric).items()
    }
    out["save_x"] = 1.0 / cost if isinstance(cost, int | float) and cost > 0 else None
    for t in targets:
        out[f"gib_to_{json_key(t)}"] = _get(summary, "to_target", json_key(t), "gib")
    hours = _get(summary, "sim", "elapsed_h")
    if hours is not None:
        out["sim_h"] = hours
    joules = _get(summary, "energy", "total_j")
    if joules is not None:
        out["energy_j"] = joules
    return out
