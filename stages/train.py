"""DVC stage `train@<run>-<seed>`: train one algorithm run with one seed."""

import sys

from _entry import fedcomm_app

if __name__ == "__main__":
    fedcomm_app()(["train", *sys.argv[1:]])  # --run NAME --seed S
