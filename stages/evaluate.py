"""DVC stage `evaluate@<run>-<seed>`: summaries and per-client evaluation of a trained run."""

import sys

from _entry import fedcomm_app

if __name__ == "__main__":
    fedcomm_app()(["evaluate", *sys.argv[1:]])  # --run NAME --seed S
