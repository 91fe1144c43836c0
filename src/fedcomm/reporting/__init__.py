"""Reporting: accuracy-vs-communication plots and the markdown experiment summary."""

from fedcomm.reporting.plots import plot_accuracy_vs_gib, plot_accuracy_vs_round
from fedcomm.reporting.summary import render_markdown, summary_table, write_report

__all__ = [
    "plot_accuracy_vs_gib",
    "plot_accuracy_vs_round",
    "render_markdown",
    "summary_table",
    "write_report",
]
