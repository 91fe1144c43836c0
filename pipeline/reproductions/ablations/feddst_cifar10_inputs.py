"""FedDST CIFAR-10 (Table 2): what the inputs' scaling does to FedAvgM within the 4 GiB cap.

    python pipeline/reproductions/ablations/feddst_cifar10_inputs.py

One change at a time, the same seeds and partitions (partition seed = seed), FedAvgM for the
36 rounds of the 4 GiB cut (pipeline/feddst_cifar10_caps.sh), every round evaluated:

- ``[0, 1]``: pixels scaled to [0, 1] only (the profile until the seventh session),
  ``data/abl_feddst_cifar10_raw_s<seed>.csv``;
- ``standardized``: the official code's Normalize((0.4914, 0.4822, 0.4465), (0.2023, 0.1994,
  0.2010)), the profile's default since: the table's own dense builds
  ``data/feddst_cifar10_dense_s<seed>.csv`` (seed 2 also as ``abl_feddst_cifar10_norm_s2``,
  the same configuration);
- the official nets' final softmax (``model.softmax_output``, the code's double softmax), on
  seed 2 only: ``abl_feddst_cifar10_dsm_s2`` (on [0, 1]) and ``abl_feddst_cifar10_normdsm_s2``
  (standardized).

Prints each arm's best global accuracy within 4 GiB of upload + download per seed, and the
paired comparison standardized − [0, 1] by the decision rule (docs/reproductions/README.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl

from fedcomm.evaluation.caps import curves_at_caps
from fedcomm.reporting.verdict import paired

DATA = Path(__file__).resolve().parents[3] / "docs" / "reproductions" / "data"
CAP_GIB = 4.0
ARMS = {  # label: (file name patterns with {seed}, the first found is read; seeds)
    "[0, 1]": (("abl_feddst_cifar10_raw_s{seed}.csv",), (0, 1, 2)),
    "standardized": (
        ("feddst_cifar10_dense_s{seed}.csv", "abl_feddst_cifar10_norm_s{seed}.csv"),
        (0, 1, 2),
    ),
    "[0, 1], final softmax": (("abl_feddst_cifar10_dsm_s{seed}.csv",), (2,)),
    "standardized, final softmax": (("abl_feddst_cifar10_normdsm_s{seed}.csv",), (2,)),
}


def best_within(patterns: tuple[str, ...], seeds: tuple[int, ...]) -> dict[int, float]:
    """Per seed: FedAvgM's best global accuracy within the cap (seeds whose file is missing or
    whose curve does not pass the cap are left out)."""
    out: dict[int, float] = {}
    for seed in seeds:
        found = [
            DATA / p.format(seed=seed) for p in patterns if (DATA / p.format(seed=seed)).is_file()
        ]
        if not found:
            continue
        path = found[0]
        frame = pl.read_csv(path).filter(pl.col("run") == "fedavgm")
        row = curves_at_caps(frame, "global_accuracy", [CAP_GIB], "up_down").row(0, named=True)
        if row["passed"] and row["best"] is not None:
            out[seed] = float(row["best"])
    return out


def main() -> int:
    values = {label: best_within(*spec) for label, spec in ARMS.items()}
    print(f"FedAvgM, best global accuracy within {CAP_GIB:g} GiB (upload + download), %\n")
    print("| inputs | " + " | ".join(f"seed {s}" for s in (0, 1, 2)) + " |")
    print("|---|" + "---:|" * 3)
    for label, per_seed in values.items():
        cells = [f"{100 * per_seed[s]:.2f}" if s in per_seed else "–" for s in (0, 1, 2)]
        print(f"| {label} | " + " | ".join(cells) + " |")
    p = paired(values["standardized"], values["[0, 1]"], scale=100)
    stats = ""
    if p.mean is not None and p.se is not None and p.t is not None:
        stats = f"{p.mean:+.2f} ± {p.se:.2f} (t = {p.t:.2f}, df {p.df}, critical {p.t_crit:.3f}): "
    print(f"\nstandardized − [0, 1], paired over seeds {list(p.seeds)}: {stats}{p.verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
