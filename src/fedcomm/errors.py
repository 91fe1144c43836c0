"""The one error type the ``fedcomm`` command turns into a single ``error:`` line (exit 2), and
the interrupt it turns into a single ``interrupted`` line (exit 130).

Every problem a user can fix by editing or replacing a file (params, a search space, the
partition, a dataset file, a trained run's outputs, the MLflow store) raises a subclass of
:class:`InputError` whose message names the file and the remedy. Anything else is a bug and
keeps its traceback. Ctrl-C is a :class:`KeyboardInterrupt`; inside a run's rounds it becomes an
:class:`Interrupted` that says where the run stopped and what a rerun does, the writes that must
finish whole defer it (:func:`interrupts_deferred`), and the code that catches it calls
:func:`stopping` before it cleans up. This module imports nothing from fedcomm, so every layer
may use it.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType


class InputError(Exception):
    """Bad or damaged input; the message names the file (or key) and what to do about it."""


class InputWarning(UserWarning):
    """Input that could not be used but need not stop the run (e.g. a stale checkpoint); the
    CLI prints it as one ``warning:`` line."""


def one_line(err: BaseException) -> str:
    """An exception's message on one line (parsers' messages can span several)."""
    return " ".join(str(err).split()) or type(err).__name__


class Interrupted(KeyboardInterrupt):
    """Ctrl-C while a run trained round ``round_``; ``checkpoint_round``: the round of the
    checkpoint it keeps on disk (0: none yet; None: the run keeps no checkpoint). Its message is
    the one line the ``fedcomm`` command prints. A :class:`KeyboardInterrupt`, so whatever
    handles Ctrl-C (an MLflow run marked ``KILLED``, a sweep's study) handles it too."""

    def __init__(self, round_: int, checkpoint_round: int | None) -> None:
        self.round_ = round_
        self.checkpoint_round = checkpoint_round
        if checkpoint_round is None:
            then = "this run keeps no checkpoint; a rerun starts at round 1"
        elif checkpoint_round == 0:
            then = "no checkpoint yet; a rerun starts at round 1"
        else:
            then = (
                f"the checkpoint of round {checkpoint_round} is kept; "
                "rerun the same command to resume"
            )
        super().__init__(f"interrupted at round {round_}; {then}")


def stop_on_interrupt(signum: int, frame: FrameType | None) -> None:
    """The ``fedcomm`` command's SIGINT handler while a verb runs: a KeyboardInterrupt, and no
    library logs from then on (Optuna's traceback of the trial it failed): the command says it in
    one line."""
    logging.disable(logging.CRITICAL)
    raise KeyboardInterrupt


def stopping() -> None:
    """Called where a Ctrl-C is caught, before the cleanup (an MLflow run marked ``KILLED``, the
    line printed): under the command, later Ctrl-Cs are ignored from here on, so the cleanup runs
    whole. Elsewhere (a library use, with its own SIGINT handling) nothing changes."""
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(signal.SIGINT) is stop_on_interrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """A Ctrl-C (SIGINT) that comes inside the block takes effect when the block ends: for writes
    that must finish whole (a checkpoint and the round it names, a run's set of outputs, an MLflow
    run and the file that records it). Where Ctrl-C is ignored or not Python's to handle (outside
    the main thread) the block just runs."""
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGINT) if main else None
    if not callable(previous):
        yield
        return
    caught: list[FrameType | None] = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(frame))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        previous(signal.SIGINT, caught[0])  # e.g. Python's default: raises KeyboardInterrupt
