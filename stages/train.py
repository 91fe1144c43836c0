"""DVC stage `train@<run>-<seed>`: train one algorithm run with one seed."""

import sys

from fedcomm.cli import app

if __name__ == "__main__":
    app(["train", *sys.argv[1:]])  # --run NAME --seed S
