"""The DVC pipeline's stages map one-to-one onto library modules (issue 31).

Every stage of ``dvc.yaml`` is a script ``stages/<stage>.py`` that makes one library call through
the ``fedcomm`` CLI, and a module ``fedcomm.stages.<stage>`` with a ``<stage>_stage`` function.
Inside the package the order is the pipeline's: ``identity``, ``paths`` and ``outputs`` sit below
the four stages, a stage imports only the stages before it, and nothing but the CLI imports
``summarize``. Read from the source, as ``test_architecture`` reads it.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from tests.unit.test_architecture import SRC, import_graph

REPO = SRC.parent
PACKAGE = "fedcomm.stages"
BELOW = ("identity", "paths", "outputs")  # what every stage may import; none of them a stage
ORDER = (*BELOW, "partition", "train", "evaluate", "summarize")  # the pipeline's order
LAST = f"{PACKAGE}.summarize"  # reads every run: the CLI's, never another module's


def dvc_stages() -> dict[str, str]:
    """``{stage: cmd}`` of the project's ``dvc.yaml``."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    return {name: stage["cmd"] for name, stage in stages.items()}


def order_violations(graph: Mapping[str, set[str]]) -> list[str]:
    """Imports inside the package against :data:`ORDER`, and importers of ``summarize`` other
    than the CLI."""
    rank = {f"{PACKAGE}.{name}": i for i, name in enumerate(ORDER)}
    found = [
        f"{a} imports {b}"
        for a, deps in graph.items()
        if a in rank
        for b in deps
        if b in rank and rank[b] >= rank[a]
    ]
    found += [f"{a} imports {LAST}" for a, d in graph.items() if LAST in d and a != "fedcomm.cli"]
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(SRC, "fedcomm")


def _functions(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def test_every_dvc_stage_is_one_library_module(graph: dict[str, set[str]]) -> None:
    stages = dvc_stages()
    assert list(stages) == ["partition", "train", "evaluate", "summarize"]
    modules = {m.rpartition(".")[2] for m in graph if m.startswith(f"{PACKAGE}.")}
    assert modules == set(stages) | set(BELOW)  # one module per stage, and the three below them
    for name, cmd in stages.items():
        assert cmd.split()[:2] == ["python", f"stages/{name}.py"]
        assert f"{name}_stage" in _functions(SRC / "fedcomm" / "stages" / f"{name}.py")
        assert f"{PACKAGE}.{name}" in graph["fedcomm.cli"]  # the verb the script calls


@pytest.mark.parametrize("name", list(dvc_stages()))
def test_a_stage_script_is_one_call_of_its_verb(name: str) -> None:
    tree = ast.parse((REPO / "stages" / f"{name}.py").read_text())
    main = [n for n in tree.body if isinstance(n, ast.If)]
    assert len(main) == 1 and len(main[0].body) == 1  # if __name__ == "__main__": <one call>
    call = main[0].body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call)
    args = call.value.args
    assert ast.unparse(call.value.func) == "fedcomm_app()"
    assert isinstance(args[0], ast.List) and ast.literal_eval(args[0].elts[0]) == name


def test_inside_the_package_the_pipeline_order_holds(graph: dict[str, set[str]]) -> None:
    assert order_violations(graph) == []


def test_the_order_check_fails_where_it_should() -> None:
    assert order_violations({f"{PACKAGE}.identity": {f"{PACKAGE}.train"}}) == [
        "fedcomm.stages.identity imports fedcomm.stages.train"
    ]
    assert order_violations({f"{PACKAGE}.partition": {f"{PACKAGE}.evaluate"}}) != []
    assert order_violations({"fedcomm.sweep.trial": {LAST}}) == [
        "fedcomm.sweep.trial imports fedcomm.stages.summarize"
    ]
    assert order_violations({f"{PACKAGE}.evaluate": {f"{PACKAGE}.train", f"{PACKAGE}.paths"}}) == []


@pytest.mark.parametrize("name", list(dvc_stages()))
def test_a_stage_that_logs_to_mlflow_lists_tracking_among_its_params(name: str) -> None:
    """A stage reading ``params.tracking`` (the store, the experiment, on or off) reruns when it
    changes: ``tracking`` is among its ``dvc.yaml`` params."""
    source = (SRC / "fedcomm" / "stages" / f"{name}.py").read_text()
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"][name]
    assert ("params.tracking" in source) == ("tracking" in stage.get("params", [])), name
