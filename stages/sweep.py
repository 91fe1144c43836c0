"""DVC stage `sweep@<space>` (pipeline/sweep/dvc.yaml): run or continue one Optuna study."""

import sys

from fedcomm.cli import app

if __name__ == "__main__":
    app(["sweep", *sys.argv[1:]])  # SPACE.yaml
