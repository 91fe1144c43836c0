"""Progress over rounds: a rich bar with accuracy and GiB so far on a terminal; elsewhere (a
``dvc repro`` log, CI) one short line on stderr every tenth of the run. A resumed run says so
first, in one line on stderr (``resuming <name> from the checkpoint of round M of R``), and its
bar starts at round M, described ``<name> (resumed at M)``."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

ProgressFn = Callable[[int, Mapping[str, float | None]], None]


@contextmanager
def round_progress(
    name: str, rounds: int, *, enabled: bool | None = None, start: int = 0
) -> Iterator[ProgressFn]:
    """Yield ``update(round, metrics)``. ``enabled``: True a bar, False nothing, None (default)
    a bar on an interactive terminal and log lines (:func:`_log_lines`) otherwise. ``start``:
    the round a resumed run resumes from (its checkpoint's), said once unless nothing is shown."""
    if enabled is False:
        yield lambda r, m: None
        return
    if start:
        print(
            f"resuming {name} from the checkpoint of round {start} of {rounds}",
            file=sys.stderr,
            flush=True,
        )
    if enabled is None and not sys.stderr.isatty():
        yield _log_lines(name, rounds)
        return
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]}  local {task.fields[local]}  {task.fields[gib]} GiB"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, transient=False) as bar:
        shown = f"{name} (resumed at {start})" if start else name
        task = bar.add_task(shown, total=rounds, completed=start, acc="-", local="-", gib="0")
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


def _log_lines(name: str, rounds: int) -> ProgressFn:
    """``update`` that prints ``name: round r/R  acc ..  local ..  G GiB`` on stderr every
    ``max(1, R // 10)`` rounds and at the last, with the latest measured accuracy."""
    every = max(1, rounds // 10)
    last_acc = "-"

    def update(round_: int, metrics: Mapping[str, float | None]) -> None:
        nonlocal last_acc
        acc, local = metrics.get("global/accuracy"), metrics.get("local/accuracy")
        if acc is not None:
            last_acc = f"{100 * acc:.2f}%"
        if round_ % every == 0 or round_ == rounds:
            shown_local = "-" if local is None else f"{100 * local:.2f}%"
            gib = f"{metrics.get('comm/cum_gib') or 0:.4g}"
            print(
                f"{name}: round {round_}/{rounds}  acc {last_acc}  local {shown_local}  {gib} GiB",
                file=sys.stderr,
                flush=True,
            )

    return update
