"""Dead ReLU units of saved ProgFed EMNIST-ConvNet models (docs/reproductions/progfed.md).

usage: FEDCOMM_DATA_ROOT=<data root> python docs/reproductions/scripts/progfed_dead_units.py \
           build/progfed_femnist/runs/progfed-s1 [more run dirs ...]

For each run's final global model (``train/model.safetensors``) it counts, on the first 4,000
FEMNIST examples (inverted, as the profile), the conv channels and fc1 units that are never
positive, and the accuracy and number of predicted classes.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from fedcomm.data.datasets.registry import load_dataset


def main(run_dirs: list[str]) -> None:
    ds = load_dataset("femnist", os.environ["FEDCOMM_DATA_ROOT"], invert=True)
    x, y = torch.from_numpy(ds.x[:4000]), torch.from_numpy(ds.y[:4000])
    for run in run_dirs:
        sd = load_file(os.path.join(run, "train", "model.safetensors"))
        with torch.no_grad():
            h1 = F.relu(F.conv2d(x, sd["conv1.weight"], sd["conv1.bias"]))  # (n, 32, 26, 26)
            h2 = F.max_pool2d(F.relu(F.conv2d(h1, sd["conv2.weight"], sd["conv2.bias"])), 2)
            h3 = F.relu(F.linear(h2.flatten(1), sd["fc1.weight"], sd["fc1.bias"]))  # (n, 128)
            pred = F.linear(h3, sd["fc2.weight"], sd["fc2.bias"]).argmax(1)
        dead1 = int((h1.amax(dim=(0, 2, 3)) == 0).sum())
        dead2 = int((h2.amax(dim=(0, 2, 3)) == 0).sum())
        dead3 = int((h3.amax(0) == 0).sum())
        acc = float((pred == y).float().mean())
        print(
            f"{run}: dead conv1 {dead1}/32, conv2 {dead2}/64, fc1 {dead3}/128; "
            f"accuracy {acc:.4f}, {int(torch.unique(pred).numel())} classes predicted"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
