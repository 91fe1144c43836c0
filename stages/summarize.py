"""DVC stage `summarize`: tables and plots over every run and seed (reports/)."""

from fedcomm.config import load_params
from fedcomm.summarize import summarize_stage

if __name__ == "__main__":
    for path in summarize_stage(load_params("params.yaml")):
        print(f"wrote {path}")
