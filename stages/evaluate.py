"""DVC stage `evaluate@<run>-<seed>`: summaries and per-client evaluation of a trained run."""

import argparse

from fedcomm.config import load_params
from fedcomm.experiment import evaluate_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--seed", type=int, required=True)
    args = ap.parse_args()
    summary = evaluate_stage(load_params("params.yaml"), args.run, args.seed)
    print(f"final global accuracy {summary['final'].get('global/accuracy')}")
