"""DVC stage `train@<run>-<seed>`: train one algorithm run with one seed."""

import argparse

from fedcomm.config import load_params
from fedcomm.experiment import train_stage

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--seed", type=int, required=True)
    args = ap.parse_args()
    print(f"wrote {train_stage(load_params('params.yaml'), args.run, args.seed)}")
