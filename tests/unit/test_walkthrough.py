"""docs/architecture.md's "how to add an algorithm" is code that runs.

The page's walk-through block is taken from the page, executed as the module it says it is,
registered, and run through the contract tests every registered algorithm passes; then the
registry is restored. Editing the page so that its algorithm breaks the contract fails here.
"""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest
import torch

from fedcomm.algorithms import ALGORITHMS, CONFIGS, build_algorithm
from fedcomm.models import build_model
from fedcomm.simulation.data import FederatedTensors
from tests.conftest import digits_federation
from tests.contract import test_algorithms as contract
from tests.contract import test_backends as backends

PAGE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
MARKER = re.compile(r"<!-- walkthrough: src/(\S+)\.py .*?-->\n```python\n(.*?)```", re.S)
NAME = "fedavg_clip"


def walkthrough() -> tuple[str, str]:
    """``(module name, source)`` of the page's walk-through block."""
    found = MARKER.findall(PAGE.read_text())
    assert len(found) == 1, "docs/architecture.md must have exactly one walk-through block"
    path, source = found[0]
    return path.replace("/", "."), source


@pytest.fixture(scope="module")
def module() -> Iterator[types.ModuleType]:
    name, source = walkthrough()
    assert name == f"fedcomm.algorithms.{NAME}" and NAME not in CONFIGS
    mod = types.ModuleType(name)
    mod.__file__ = str(PAGE)
    sys.modules[name] = mod  # pydantic and dataclasses resolve annotations through it
    try:
        exec(compile(source, f"{PAGE}:walkthrough", "exec"), mod.__dict__)
        yield mod
    finally:
        ALGORITHMS.pop(NAME, None)
        CONFIGS.pop(NAME, None)
        sys.modules.pop(name, None)


@pytest.fixture(scope="module")
def fed() -> FederatedTensors:
    return digits_federation(6)


def test_the_block_registers_its_algorithm(module: types.ModuleType) -> None:
    assert CONFIGS[NAME] is module.Config
    assert build_algorithm(module.Config()).name == NAME
    with pytest.raises(pydantic.ValidationError, match="clip"):
        module.Config(clip=-1.0)


def test_it_passes_the_contract(
    module: types.ModuleType, fed: FederatedTensors, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    contract.test_default_config_validates_and_forbids_extras(NAME)
    contract.test_two_rounds_are_deterministic(NAME, fed)
    contract.test_state_round_trips_through_checkpoint(NAME, fed, tmp_path)
    contract.test_every_message_is_in_the_ledger(NAME, fed)
    contract.test_client_data_is_not_mutated(NAME, fed)
    monkeypatch.setattr(backends, "BATCHED", backends.BATCHED | {NAME})  # it must batch
    for local in backends.LOCALS:
        backends.test_vectorized_matches_sequential(NAME, local, fed)


def test_it_does_what_its_docstring_says(module: types.ModuleType) -> None:
    delta = {"w": torch.tensor([3.0, 4.0]), "b": torch.tensor([0.0])}  # ‖Δ‖ = 5
    out = module.clipped(delta, 1.0)
    assert torch.allclose(out["w"], torch.tensor([0.6, 0.8]))
    assert module.clipped(delta, 10.0)["w"].tolist() == [3.0, 4.0]  # inside the ball: unchanged


def test_its_uploads_are_clipped(module: types.ModuleType, fed: FederatedTensors) -> None:
    """One round with server SGD at lr 1 moves the model by the mean of clipped updates, so by
    at most ``clip`` (a mean of vectors in a ball stays in it); unclipped, it moves further."""
    torch.manual_seed(0)  # the initial model of backends._run
    model = build_model("mlp", input_shape=fed.input_shape, num_classes=10, hidden=[16])
    init = {k: v.detach() for k, v in model.named_parameters()}

    def moved(clip: float) -> float:
        res = backends._run(NAME, fed, "sequential", rounds=1, clip=clip)
        return float(torch.sqrt(sum(((res.final_params[k] - init[k]) ** 2).sum() for k in init)))

    assert moved(1e6) > 0.05
    assert 0 < moved(0.05) <= 0.05 * (1 + 1e-5)
