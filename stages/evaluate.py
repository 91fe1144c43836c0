"""DVC stage `evaluate@<run>-<seed>`: summaries and per-client evaluation of a trained run."""

import sys

from fedcomm.cli import app

if __name__ == "__main__":
    app(["evaluate", *sys.argv[1:]])  # --run NAME --seed S
