"""The one error type the ``fedcomm`` command turns into a single ``error:`` line (exit 2).

Every problem a user can fix by editing or replacing a file (params, a search space, the
partition, a dataset file, a trained run's outputs, the MLflow store) raises a subclass of
:class:`InputError` whose message names the file and the remedy. Anything else is a bug and
keeps its traceback. This module imports nothing from fedcomm, so every layer may use it.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad or damaged input; the message names the file (or key) and what to do about it."""


class InputWarning(UserWarning):
    """Input that could not be used but need not stop the run (e.g. a stale checkpoint); the
    CLI prints it as one ``warning:`` line."""


def one_line(err: BaseException) -> str:
    """An exception's message on one line (parsers' messages can span several)."""
    return " ".join(str(err).split()) or type(err).__name__
