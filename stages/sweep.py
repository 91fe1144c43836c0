"""DVC stage `sweep@<space>` (pipeline/sweep/dvc.yaml): run or continue one Optuna study."""

import sys

from _entry import fedcomm_app

if __name__ == "__main__":
    fedcomm_app()(["sweep", *sys.argv[1:]])  # SPACE.yaml
