"""The layout of ``fedcomm.config``: one obvious place for every key of ``params.yaml``.

The table in ``fedcomm/config/__init__.py``'s docstring maps each params section to its module;
these tests hold it to the code, and check that ``from fedcomm.config import X`` works for every
public name of every module of the package.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import typing
from pathlib import Path
from types import UnionType
from typing import Any

from pydantic import BaseModel

import fedcomm.config as config
from fedcomm.config import Params

ROW = re.compile(r"^``(?P<keys>[a-z_.]+)``\s+:mod:`(?P<module>[\w.]+)`(?P<rest>.*)$")


def table() -> dict[str, tuple[str, str]]:
    """``{section: (module, the row's text)}`` from the package docstring's table."""
    rows: dict[str, tuple[str, str]] = {}
    last = ""
    for line in (config.__doc__ or "").splitlines():
        m = ROW.match(line)
        if m:
            last = m["keys"]
            rows[last] = (m["module"], m["rest"])
        elif last and line.startswith(" " * 8) and line.strip():  # a row's continuation
            rows[last] = (rows[last][0], rows[last][1] + " " + line.strip())
        elif not line.strip() or line.startswith("="):
            last = ""
    return rows


def models_of(annotation: Any) -> set[type[BaseModel]]:
    """The pydantic models a field's annotation admits (through Annotated, unions, list/dict)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return {annotation}
    origin = typing.get_origin(annotation)
    if origin in (typing.Annotated,):
        return models_of(typing.get_args(annotation)[0])
    if origin in (typing.Union, UnionType, list, dict):
        return set().union(*(models_of(a) for a in typing.get_args(annotation)))
    return set()


def test_the_table_names_every_section_and_only_those() -> None:
    assert set(table()) == set(Params.model_fields)


def test_each_section_is_defined_in_the_module_its_row_names() -> None:
    rows = table()
    for section, field in Params.model_fields.items():
        module, rest = rows[section]
        importlib.import_module(module)  # the row names a module that exists
        for model in models_of(field.annotation):
            if model.__module__.startswith("fedcomm.config"):
                assert model.__module__ == module, (section, model)
            else:  # a schema that lives beside its code (the algorithms): the row says where
                assert any(model.__module__.startswith(m) for m in re.findall(r"`([\w.]+)`", rest))


def test_each_subsection_kept_beside_its_code_is_named_in_its_sections_row() -> None:
    """``train.compressor`` and the like: a field whose schema is outside ``fedcomm.config``."""
    rows = table()
    for section, field in Params.model_fields.items():
        if section == "algorithms":
            continue
        for model in models_of(field.annotation):
            for key, sub in model.model_fields.items():
                for inner in models_of(sub.annotation):
                    if not inner.__module__.startswith("fedcomm.config"):
                        module = importlib.import_module(inner.__module__).__name__
                        row = rows[section][1]
                        named = re.findall(rf"``{section}\.{key}`` :mod:`([\w.]+)`", row)
                        assert named, f"{section}.{key} ({module}) is not in the table"
                        assert getattr(importlib.import_module(named[0]), inner.__name__) is inner


def public_names(module_name: str) -> set[str]:
    """The names a module of the package defines at its top level, without a leading ``_``."""
    module = importlib.import_module(module_name)
    tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {n for n in names if not n.startswith("_")}


def test_every_public_name_of_the_package_is_exported_by_it() -> None:
    modules = [m.name for m in pkgutil.iter_modules(config.__path__, "fedcomm.config.")]
    assert modules, "no modules found"
    for name in modules:
        module = importlib.import_module(name)
        for public in public_names(name):
            assert public in config.__all__, f"{name}.{public} is not in fedcomm.config.__all__"
            assert getattr(config, public) is getattr(module, public)
    for public in config.__all__:
        assert hasattr(config, public)
