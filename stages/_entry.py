"""What every stage script starts with: the ``fedcomm`` command from the library DVC tracks.

A stage runs the ``src/fedcomm`` that sits beside ``stages/`` (it is put first on ``sys.path``):
exactly the code DVC hashes as the stage's dependency, in the project, in a DVC experiment's
temporary copy and in ``build/<name>/`` of ``make reproduce``, never some other installed copy.
The library's own dependencies (torch, polars, mlflow, ...) come from the interpreter: a
``python`` that lacks them is not the project's virtualenv, and the stage ends with one line that
says what to do and exit status 2 instead of a traceback.

Ctrl-C while the stage starts (the library's imports take seconds) ends it with one line and
exit status 130, no traceback: until the ``fedcomm`` command takes SIGINT over (it ends a verb
the same way, :mod:`fedcomm.cli`), a SIGINT exits at once.
"""

from __future__ import annotations

import os
import signal
import sys


def _starting(signum: int, frame: object) -> None:
    os.write(2, b"interrupted while starting; rerun the same command\n")
    os._exit(130)  # nothing done yet, nothing to clean up


if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # (not where it is ignored)
    signal.signal(signal.SIGINT, _starting)

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

SRC = Path(__file__).resolve().parent.parent / "src"  # the library beside stages/
REMEDY = (
    "run the pipeline with the project's virtualenv: `source .venv/bin/activate` in the "
    "project's root, once per shell (`make repro` creates it)"
)


def fedcomm_app() -> Any:
    """The ``fedcomm`` Typer app, imported from ``SRC``; exit 2 with one line if it cannot be."""
    here = (SRC / "fedcomm").is_dir()
    if here:
        sys.path.insert(0, str(SRC))
    try:
        from fedcomm.cli import app
    except ModuleNotFoundError as err:
        missing = err.name or "?"
        if here and missing.split(".")[0] == "fedcomm":
            raise  # a module of the library itself is missing: a bug, not the environment
        script = Path(sys.argv[0]).name
        print(
            f"error: stages/{script}: {sys.executable} cannot import {missing!r}: {REMEDY}",
            file=sys.stderr,
        )
        raise SystemExit(2) from None
    return app
