"""A rich progress bar over rounds showing accuracy and GiB so far (quiet when not a TTY)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

ProgressFn = Callable[[int, Mapping[str, float | None]], None]


@contextmanager
def round_progress(name: str, rounds: int, *, enabled: bool | None = None) -> Iterator[ProgressFn]:
    """Yield ``update(round, metrics)``; shown only on an interactive terminal by default."""
    show = sys.stderr.isatty() if enabled is None else enabled
    if not show:
        yield lambda r, m: None
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]}  local {task.fields[local]}  {task.fields[gib]} GiB"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task(name, total=rounds, acc="-", local="-", gib="0")
        last_acc = "-"

        def update(round_: int, metrics: Mapping[str, float | None]) -> None:
            nonlocal last_acc
            acc = metrics.get("global/accuracy")
            local = metrics.get("local/accuracy")
            if acc is not None:
                last_acc = f"{100 * acc:.2f}%"
            bar.update(
                task,
                completed=round_,
                acc=last_acc,
                local="-" if local is None else f"{100 * local:.2f}%",
                gib=f"{metrics.get('comm/cum_gib') or 0:.4g}",
            )

        yield update
