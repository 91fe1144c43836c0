"""The layers of ``src/fedcomm`` (``docs/architecture.md``): no import cycles, no upward imports.

The import graph is read from the source (every ``import``, including those under
``TYPE_CHECKING`` and inside functions: a lazy import still ties two modules together), so the
check needs nothing to be importable and sees what a reader sees.

Layers, lowest first; a module may import its own layer and the layers below it:

0. foundation: ``types errors atomic paths seeding sparse_io`` and the package root;
1. building blocks: ``comm models data server_opt run_files system``;
2. ``algorithms`` (inside it, the shared pieces -- ``core``, the contract and its machinery, and
   the families' packages ``submodel`` (the sub-model family's rule) and ``sparse`` (the
   sparse-mask family's masks, budgets and messages) -- never import an algorithm or a paper's
   package: algorithms compose them, not the reverse; a family builds on ``core`` and no other
   family, and ``core`` imports no family; outside a paper's package, code uses the package, not
   its helpers; and the top of ``algorithms/`` lists the algorithms: every entry but the shared
   pieces registers one);
3. ``evaluation``;  4. ``simulation`` (the round loop);  5. ``config`` (the params schema);
6. ``tracking`` (the only mlflow user);  7. ``reporting``;  8. ``stages`` (one module per DVC
   stage: ``tests/unit/test_stages_layout.py`` checks the order inside it);
9. ``sweep``;  10. ``cli``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(names.split())
    for names in (
        "fedcomm types errors atomic paths seeding philox sparse_io",
        "comm models data server_opt run_files system",
        "algorithms",
        "evaluation",
        "simulation",
        "config",
        "tracking",
        "reporting",
        "stages",
        "sweep",
        "cli",
    )
)


def module_names(src: Path, package: str) -> dict[str, Path]:
    """``{dotted name: file}`` of every module of ``package`` under ``src``."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def imports_of(name: str, path: Path, known: Iterable[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (at ``path``) imports, anywhere in it."""
    known = set(known)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule when there is one
            targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` imports a.b.c (or its parent)
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(src: Path, package: str) -> dict[str, set[str]]:
    mods = module_names(src, package)
    return {name: imports_of(name, path, mods) for name, path in mods.items()}


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def layer_of(module: str, layers: tuple[frozenset[str], ...] = LAYERS) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else parts[0]
    for i, names in enumerate(layers):
        if top in names:
            return i
    raise AssertionError(f"{module}: its top-level name {top!r} is in no layer; add it to LAYERS")


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
        for a, deps in graph.items()
        for b in deps
        if layer_of(b) > layer_of(a)
    )


SHARED = frozenset({"core", "submodel", "sparse"})  # the pieces algorithms compose, not algorithms


def piece(module: str) -> str | None:
    """The entry of ``algorithms/`` a module belongs to: ``""`` for the package itself, ``core``,
    a family's package (``submodel``, ``sparse``), or an algorithm's module or paper's package;
    None outside ``algorithms``."""
    parts = module.split(".")
    if parts[:2] != ["fedcomm", "algorithms"]:
        return None
    return parts[2] if len(parts) > 2 else ""


def shared_pieces_importing_algorithms(graph: Mapping[str, set[str]]) -> list[str]:
    """Shared pieces (``core``, ``submodel``, ``sparse``) that import an algorithm, a paper's
    package or the ``algorithms`` package itself (which imports every algorithm), and a shared
    piece importing another one but ``core`` (a family builds on the contract, not the reverse,
    and on no other family)."""
    found = []
    for a, deps in graph.items():
        pa = piece(a)
        if pa not in SHARED:
            continue
        for b in deps:
            pb = piece(b)
            if pb is None:
                continue
            if pb not in (pa, "core"):
                found.append(f"{a} imports {b}")
    return sorted(found)


def helpers_imported_from_outside(graph: Mapping[str, set[str]]) -> list[str]:
    """A paper's package is used through its ``__init__``: a module outside the package that
    imports one of its helpers (``fedcomm.algorithms.fedbiad.rows``) reaches past it."""
    return sorted(
        f"{a} imports {b}"
        for a, deps in graph.items()
        for b in deps
        if len(b.split(".")) > 3 and piece(b) not in (None, *SHARED) and piece(a) != piece(b)
    )


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(SRC, "fedcomm")


def test_the_graph_is_read(graph: dict[str, set[str]]) -> None:
    assert "fedcomm.algorithms.core" in graph["fedcomm.algorithms.fedavg"]
    assert "fedcomm.algorithms.fedbiad.rows" in graph["fedcomm.algorithms.fedbiad.algorithm"]
    assert "fedcomm.simulation.loop" in graph["fedcomm.stages.train"]


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_every_module_is_in_a_layer(graph: dict[str, set[str]]) -> None:
    for module in graph:
        layer_of(module)


def test_no_lower_layer_imports_a_higher_one(graph: dict[str, set[str]]) -> None:
    assert upward_imports(graph) == []


def test_shared_algorithm_pieces_import_no_algorithm(graph: dict[str, set[str]]) -> None:
    assert shared_pieces_importing_algorithms(graph) == []


def test_a_papers_helpers_stay_inside_its_package(graph: dict[str, set[str]]) -> None:
    assert helpers_imported_from_outside(graph) == []


def test_the_top_of_algorithms_lists_the_algorithms() -> None:
    """Every entry at the top of ``algorithms/`` other than the shared pieces registers an
    algorithm (a single file, or a package for a paper that needs several); no private helper
    module is left at the top (a multi-file algorithm is a package)."""
    from fedcomm.algorithms import ALGORITHMS

    top = SRC / "fedcomm" / "algorithms"
    entries = sorted(
        p.stem
        for p in top.iterdir()
        if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").is_file()
    )
    registering = {builder.__module__.split(".")[2] for builder in ALGORITHMS.values()}
    assert [e for e in entries if e not in SHARED and e not in registering] == []
    assert set(entries) >= SHARED
    assert len(entries) <= 20, entries


# --- the checks themselves fail where they should ----------------------------------------------


def _tree(tmp_path: Path, files: Mapping[str, str]) -> dict[str, set[str]]:
    for rel, text in files.items():
        path = tmp_path / "fedcomm" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return import_graph(tmp_path, "fedcomm")


def test_a_cycle_through_a_lazy_import_is_found(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "comm/__init__.py": "",
            "comm/a.py": "from fedcomm.comm import b\n",
            "comm/b.py": "def f():\n    from fedcomm.comm.a import x\n",
            "comm/c.py": "from . import a\n",
        },
    )
    assert cycles(graph) == [["fedcomm.comm.a", "fedcomm.comm.b"]]


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "types.py": "",
            "algorithms/__init__.py": "",
            "algorithms/core/__init__.py": "",
            "algorithms/core/contract.py": (
                "import fedcomm.types\nfrom fedcomm.algorithms import fedx\n"
            ),
            "algorithms/fedx.py": "from ..simulation.loop import run\nfrom .pap import rows\n",
            "algorithms/pap/__init__.py": "from .rows import f\n",
            "algorithms/pap/rows.py": "from ... import types\n",
            "simulation/__init__.py": "",
            "simulation/loop.py": "from fedcomm import types\n",
        },
    )
    assert cycles(graph) == []
    assert upward_imports(graph) == [
        "fedcomm.algorithms.fedx (layer 2) imports fedcomm.simulation.loop (layer 4)"
    ]
    assert shared_pieces_importing_algorithms(graph) == [
        "fedcomm.algorithms.core.contract imports fedcomm.algorithms.fedx"
    ]
    assert helpers_imported_from_outside(graph) == [
        "fedcomm.algorithms.fedx imports fedcomm.algorithms.pap.rows"
    ]


def test_a_family_builds_on_core_and_no_other_family(tmp_path: Path) -> None:
    graph = _tree(
        tmp_path,
        {
            "__init__.py": "",
            "algorithms/__init__.py": "",
            "algorithms/core/__init__.py": "",
            "algorithms/core/jobs.py": "from fedcomm.algorithms.sparse import masks\n",
            "algorithms/sparse/__init__.py": "",
            "algorithms/sparse/masks.py": "from fedcomm.algorithms.core import jobs\n",
            "algorithms/sparse/codec.py": "from fedcomm.algorithms.sparse.masks import Masks\n",
            "algorithms/submodel/__init__.py": "",
            "algorithms/submodel/units.py": "from fedcomm.algorithms.sparse import codec\n",
            "algorithms/pap/__init__.py": "from fedcomm.algorithms.sparse.codec import f\n",
        },
    )
    assert shared_pieces_importing_algorithms(graph) == [
        "fedcomm.algorithms.core.jobs imports fedcomm.algorithms.sparse.masks",
        "fedcomm.algorithms.submodel.units imports fedcomm.algorithms.sparse.codec",
    ]
    assert helpers_imported_from_outside(graph) == []  # a family's modules are for everyone


def test_the_train_stage_imports_no_plotting_library() -> None:
    """Every train process (a DVC stage, each seed of a sweep trial) pays its imports: the run's
    plots are the evaluate stage's, so training loads neither matplotlib nor Altair (~0.6 s)."""
    code = (
        "import sys, fedcomm.stages.train, fedcomm.cli\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'matplotlib', 'altair'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
