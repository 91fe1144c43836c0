"""Which runs a report compares: the MLflow runs found, grouped by the value of one tag and by
configuration (everything but the seed), with re-runs of one seed dropped (the newest is kept).
The notes say what was dropped and where a group still mixes configurations.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from fedcomm.config import ConfigError
from fedcomm.tracking.mlflow import DVC_EXP_TAG
from fedcomm.tracking.query import SEED_PARAM, RunRecord

SWEEP_TAGS = ("fedcomm.study", "optuna.trial_number")  # on a sweep trial's training runs
MAX_SHOWN_DIFFS = 4  # differing params named in a split group's label


def group_runs(records: Sequence[RunRecord], group_by: str) -> dict[str, list[RunRecord]]:
    """``{label: runs}``, groups sorted by label. A group is one value of the ``group_by`` tag
    *and* one configuration (:attr:`RunRecord.config_key`, everything but the seed): runs that
    share a tag value but differ in config (``mu`` 0.1 and 0.5 under one run name) are separate
    groups, labelled ``value [key=v, ...]`` with the params that differ.

    Raises:
        ConfigError: a run without the ``group_by`` tag (the message names tag and run).
    """
    by_value: dict[str, dict[str, list[RunRecord]]] = {}
    for rec in records:
        if group_by not in rec.tags:
            raise ConfigError(
                f"group_by: MLflow run {rec.run_id} ({rec.run_name}, experiment "
                f"{rec.experiment!r}) has no tag {group_by!r}"
            )
        by_value.setdefault(rec.tags[group_by], {}).setdefault(rec.config_key, []).append(rec)
    groups: dict[str, list[RunRecord]] = {}
    for value, configs in by_value.items():
        if len(configs) == 1:
            groups[value] = next(iter(configs.values()))
            continue
        keys = differing_params([runs[0].params for runs in configs.values()])
        shown = keys[:MAX_SHOWN_DIFFS]
        more = f", +{len(keys) - len(shown)} more" if len(keys) > len(shown) else ""
        for runs in configs.values():
            p = runs[0].params
            diff = ", ".join(f"{k}={p.get(k, '-')}" for k in shown)
            groups[f"{value} [{diff}{more}]"] = runs
    return dict(sorted(groups.items()))


def differing_params(configs: Sequence[Mapping[str, str]]) -> list[str]:
    """The param keys (seed aside) whose values are not the same in every config, sorted."""
    keys = sorted({k for c in configs for k in c} - {SEED_PARAM})
    return [k for k in keys if len({c.get(k) for c in configs}) > 1]


def _rerun_key(rec: RunRecord) -> tuple[str, ...]:
    """Runs with equal keys are re-runs of one configuration: same experiment, run key, seed,
    DVC experiment and (for sweep runs) study and trial."""
    if rec.seed is None:
        return (rec.run_id,)
    same = (DVC_EXP_TAG, *SWEEP_TAGS)
    tags = (rec.tags.get(t, "") for t in same)
    return (rec.experiment, rec.tags["run"], str(rec.seed), rec.config_key, *tags)


def drop_reruns(group: str, runs: Sequence[RunRecord]) -> tuple[list[RunRecord], list[str]]:
    """Keep the newest run of each re-run key; the kept runs sorted by seed, and one note per
    key that had re-runs."""
    by_key: dict[tuple[str, ...], list[RunRecord]] = {}
    for rec in runs:
        by_key.setdefault(_rerun_key(rec), []).append(rec)
    kept: list[RunRecord] = []
    notes: list[str] = []
    for same in by_key.values():
        newest, *older = sorted(same, key=lambda r: (r.start_time_ms, r.run_id), reverse=True)
        kept.append(newest)
        if older:
            dropped = ", ".join(r.run_id for r in older)
            notes.append(
                f"`{group}` seed {newest.seed}: re-run; kept the newest MLflow run "
                f"{newest.run_id}, left out {dropped}"
            )
    kept.sort(key=lambda r: (r.seed if r.seed is not None else -1, r.start_time_ms))
    return kept, notes


def mixed_seeds_note(group: str, runs: Sequence[RunRecord]) -> list[str]:
    """A note when a group holds several runs of one seed after re-runs were dropped: they come
    from different DVC experiments, sweep trials or MLflow experiments, so the mean mixes
    configurations."""
    seeds = [r.seed for r in runs]
    repeated = sorted({s for s in seeds if s is not None and seeds.count(s) > 1})
    if not repeated:
        return []
    dvc = sorted({r.tags.get(DVC_EXP_TAG) or "(workspace)" for r in runs})
    return [
        f"`{group}` has several runs of seed(s) {', '.join(map(str, repeated))} (DVC experiments: "
        f"{', '.join(dvc)}; or sweep trials / MLflow experiments): its mean mixes configurations. "
        "Narrow the selection by DVC experiment, tags or experiment."
    ]


def select_runs(
    records: Sequence[RunRecord], group_by: str
) -> tuple[list[tuple[str, RunRecord]], list[str]]:
    """Group, drop re-runs; ``([(group, run)], notes)`` in group then seed order."""
    chosen: list[tuple[str, RunRecord]] = []
    notes: list[str] = []
    for group, runs in group_runs(records, group_by).items():
        kept, dropped = drop_reruns(group, runs)
        chosen += [(group, rec) for rec in kept]
        notes += dropped + mixed_seeds_note(group, kept)
    return chosen, notes
