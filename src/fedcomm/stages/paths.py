"""Where the stages read and write: the partition, the runs, the reports and the checkpoints."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fedcomm.stages.identity import run_name


@dataclass(frozen=True)
class Paths:
    """Where the stages read and write, relative to the working directory by default."""

    partition: Path = Path("data/partition")
    runs: Path = Path("runs")
    reports: Path = Path("reports")
    checkpoints: Path = Path(".fedcomm/checkpoints")

    def run_dir(self, run: str, seed: int) -> Path:
        return self.runs / run_name(run, seed)

    def train_dir(self, run: str, seed: int) -> Path:
        """The train stage's output directory (the evaluate stage writes beside it)."""
        return self.run_dir(run, seed) / "train"
