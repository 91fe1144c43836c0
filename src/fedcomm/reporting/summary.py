"""The experiment report: a per-algorithm table (mean ± SE over seeds) and the plots, in markdown.

``summary_table`` turns the seeds' run summaries (:func:`fedcomm.evaluation.summarize_run`) into a
numeric polars table; ``render_markdown`` formats it (accuracies in percent with 2 decimals,
GiB with 4 significant digits); ``write_report`` writes ``summary.md`` and the PNGs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import polars as pl

from fedcomm.atomic import write_text
from fedcomm.evaluation.seeds import aggregate_seeds
from fedcomm.reporting.plots import (
    has_energy,
    has_sim_time,
    metric_axis,
    plot_accuracy_vs_energy,
    plot_accuracy_vs_gib,
    plot_accuracy_vs_gib_and_sim_time,
    plot_accuracy_vs_round,
)

Kind = Literal["percent", "gib"]

# column stem, path in a run summary, header, formatting kind
COLUMNS: tuple[tuple[str, tuple[str, str], str, Kind], ...] = (
    ("final_global_acc", ("final", "global/accuracy"), "Final global acc (%)", "percent"),
    ("best_global_acc", ("best", "global/accuracy"), "Best global acc (%)", "percent"),
    ("final_local_acc", ("final", "local/accuracy"), "Final local acc (%)", "percent"),
    ("best_local_acc", ("best", "local/accuracy"), "Best local acc (%)", "percent"),
    ("final_topk_acc", ("final", "topk/accuracy"), "Final top-k acc (%)", "percent"),
    ("up_gib", ("final", "comm/up_gib"), "Up (GiB)", "gib"),
    ("down_gib", ("final", "comm/down_gib"), "Down (GiB)", "gib"),
    ("total_gib", ("final", "comm/cum_gib"), "Total (GiB)", "gib"),
    ("sparsity", ("final", "model/sparsity"), "Sparsity (%)", "percent"),
)
PLOTS = (
    ("global_accuracy_vs_gib.png", "Global accuracy vs communication"),
    ("local_accuracy_vs_gib.png", "Local accuracy vs communication"),
    ("accuracy_vs_round.png", "Global accuracy vs round"),
)
# only when the runs have simulated time (a ``system`` section)
SIM_PLOT = (
    "accuracy_vs_gib_and_sim_time.png",
    "Global accuracy vs communication and vs simulated time",
)
# only when the runs have the clients' energy (``system.energy``)
ENERGY_PLOT = ("accuracy_vs_energy.png", "Global accuracy vs the clients' energy")


def _leaf(aggregated: Mapping[str, Any], path: tuple[str, str]) -> Mapping[str, Any]:
    """The ``{"mean", "se", "n"}`` leaf at ``path`` of an aggregated summary (nulls if absent)."""
    node = aggregated.get(path[0], {}).get(path[1])
    return node if isinstance(node, Mapping) else {"mean": None, "se": None}


def summary_table(per_algorithm: Mapping[str, Sequence[Mapping[str, Any]]]) -> pl.DataFrame:
    """One row per algorithm: mean and standard error over seeds of the headline numbers.

    Args:
        per_algorithm: algorithm label -> run summaries of its seeds.

    Returns:
        Columns ``algorithm``, ``seeds`` and, for each stem in :data:`COLUMNS`,
        ``<stem>_mean`` and ``<stem>_se`` (Float64, fractions and GiB; null when unmeasured).
    """
    rows: list[dict[str, Any]] = []
    for algorithm, summaries in per_algorithm.items():
        aggregated = aggregate_seeds(summaries)
        row: dict[str, Any] = {"algorithm": algorithm, "seeds": len(summaries)}
        for stem, path, _, _ in COLUMNS:
            leaf = _leaf(aggregated, path)
            row[f"{stem}_mean"], row[f"{stem}_se"] = leaf["mean"], leaf["se"]
        rows.append(row)
    schema: dict[str, Any] = {"algorithm": pl.String, "seeds": pl.Int64}
    for stem, *_ in COLUMNS:
        schema |= {f"{stem}_mean": pl.Float64, f"{stem}_se": pl.Float64}
    return pl.DataFrame(rows, schema=schema)


def format_value(mean: float | None, se: float | None, kind: Kind, *, seeds: int) -> str:
    """``"mean ± se"``: percent with 2 decimals or GiB with 4 significant digits.

    The ``± se`` part is left out for a single seed; a missing mean gives ``"–"``.

    Args:
        mean: the mean (a fraction for ``"percent"``).
        se: its standard error.
        kind: ``"percent"`` or ``"gib"``.
        seeds: number of seeds.

    Returns:
        The formatted cell.
    """
    if mean is None:
        return "–"

    def fmt(v: float) -> str:
        return f"{100 * v:.2f}" if kind == "percent" else f"{v:#.4g}".rstrip(".")

    if seeds < 2 or se is None:
        return fmt(mean)
    return f"{fmt(mean)} ± {fmt(se)}"


def _shown_columns(table: pl.DataFrame) -> list[tuple[str, tuple[str, str], str, Kind]]:
    """:data:`COLUMNS` minus the top-k column when it repeats top-1 (``train.topk: 1``) or was
    never measured."""
    topk, top1 = table["final_topk_acc_mean"], table["final_global_acc_mean"]
    redundant = topk.is_null().all() or bool((topk.fill_null(-1) == top1.fill_null(-1)).all())
    return [c for c in COLUMNS if not (c[0] == "final_topk_acc" and redundant)]


def _markdown_table(table: pl.DataFrame) -> list[str]:
    """The results table as markdown lines."""
    columns = _shown_columns(table)
    headers = ["Algorithm", "Seeds", *(header for _, _, header, _ in columns)]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * 2 + "---:|" * len(columns)]
    for row in table.iter_rows(named=True):
        cells = [f"`{row['algorithm']}`", str(row["seeds"])]
        cells += [
            format_value(row[f"{stem}_mean"], row[f"{stem}_se"], kind, seeds=row["seeds"])
            for stem, _, _, kind in columns
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_markdown(
    table: pl.DataFrame,
    *,
    title: str,
    plots: Sequence[tuple[str, str]],
    notes: Sequence[str] = (),
    sections: Sequence[str] = (),
    last_k: int,
) -> str:
    """A markdown report: title, the results table, extra sections, the plot images, then notes.

    Args:
        table: output of :func:`summary_table`.
        title: report title.
        plots: ``(caption, relative path)`` per image.
        notes: free-text bullet points.
        sections: ready markdown blocks placed after the results table.
        last_k: the number of evaluations the final accuracies average (1: the last
            measured round), for the table's header line.

    Returns:
        The markdown text (ends with a newline).
    """
    lines = [f"# {title}", "", "## Results", ""]
    if last_k == 1:
        final = "final = the last evaluation"
    else:
        final = (
            f"final accuracy = mean of each seed's last {last_k} evaluations "
            "(GiB and sparsity: the last round)"
        )
    lines += [f"Mean ± standard error over seeds; {final}.", ""]
    lines += [*_markdown_table(table), ""]
    for block in sections:
        lines += [block.rstrip("\n"), ""]
    if plots:
        lines += ["## Plots", ""]
        for caption, rel in plots:
            lines += [f"### {caption}", "", f"![{caption}]({rel})", ""]
    if notes:
        lines += ["## Notes", "", *(f"- {note}" for note in notes), ""]
    return "\n".join(lines)


def write_report(
    out_dir: Path,
    per_algorithm_rounds: Mapping[str, Sequence[pl.DataFrame]],
    per_algorithm_summaries: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    title: str,
    notes: Sequence[str] = (),
    sections: Sequence[str] = (),
    metric: str = "global/accuracy",
    last_k: int,
) -> list[Path]:
    """Write ``summary.md`` and ``plots/*.png`` under ``out_dir``.

    Args:
        out_dir: report directory.
        per_algorithm_rounds: algorithm -> rounds tables of its seeds (for the curves).
        per_algorithm_summaries: algorithm -> run summaries of its seeds (for the table).
        title: report title.
        notes: extra bullet points at the end of the markdown.
        sections: extra markdown blocks after the results table.
        metric: the global accuracy the first and third plots show (``topk/accuracy`` for
            next-word prediction, ``evaluate.metric``).
        last_k: the rule of the summaries' final accuracies (the mean of each seed's last
            ``last_k`` evaluations, :func:`~fedcomm.evaluation.summaries.summarize_run`), for
            the table's header.

    Returns:
        The written paths: the three plots (four when the runs have simulated time: accuracy
        against GiB beside accuracy against simulated hours; five with the clients' energy:
        accuracy against it), then ``summary.md``.
    """
    plot_dir = out_dir / "plots"
    gib_global, gib_local, by_round = (plot_dir / name for name, _ in PLOTS)
    plot_accuracy_vs_gib(per_algorithm_rounds, gib_global, metric=metric)
    plot_accuracy_vs_gib(per_algorithm_rounds, gib_local, metric="local/accuracy")
    plot_accuracy_vs_round(per_algorithm_rounds, by_round, metric=metric)
    plots, written = list(PLOTS), [gib_global, gib_local, by_round]
    if has_sim_time(per_algorithm_rounds):
        sim_plot = plot_dir / SIM_PLOT[0]
        plot_accuracy_vs_gib_and_sim_time(per_algorithm_rounds, sim_plot, metric=metric)
        plots.insert(1, SIM_PLOT)
        written.append(sim_plot)
    if has_energy(per_algorithm_rounds):
        energy_plot = plot_dir / ENERGY_PLOT[0]
        plot_accuracy_vs_energy(per_algorithm_rounds, energy_plot, metric=metric)
        plots.insert(2, ENERGY_PLOT)
        written.append(energy_plot)
    label = metric_axis(metric)[0].removesuffix(" (%)")  # "Top-k accuracy"
    captions = [c.replace("Global accuracy", label) for _, c in plots]
    markdown = render_markdown(
        summary_table(per_algorithm_summaries),
        title=title,
        plots=[(c, f"plots/{name}") for (name, _), c in zip(plots, captions, strict=True)],
        notes=notes,
        sections=sections,
        last_k=last_k,
    )
    summary = out_dir / "summary.md"
    write_text(summary, markdown)
    return [*written, summary]
