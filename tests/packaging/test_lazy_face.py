"""The lazy face: every public name reaches users and type checkers alike.

Type checkers read the ``TYPE_CHECKING`` imports of ``safedma/__init__.py``; the
run time reads ``_HOMES``. Both must list exactly ``__all__``, each name from
the same module, or a checker and the run time would disagree.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import safedma

INIT = Path(safedma.__file__)


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse(INIT.read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for stmt in node.body:
                assert isinstance(stmt, ast.ImportFrom) and stmt.module
                for alias in stmt.names:
                    assert alias.asname == alias.name, f"{alias.name}: re-export as itself"
                    found[alias.name] = stmt.module
    return found


def test_checkers_and_run_time_see_the_same_names() -> None:
    homes = safedma._HOMES  # pyright: ignore[reportPrivateUsage]
    assert _type_checking_imports() == homes
    assert sorted(homes) == sorted(safedma.__all__)


@pytest.mark.parametrize("name", safedma.__all__)
def test_each_name_is_its_home_modules_object(name: str) -> None:
    home = importlib.import_module(safedma._HOMES[name])  # pyright: ignore[reportPrivateUsage]
    assert getattr(safedma, name) is getattr(home, name)


def test_from_import_star_and_dir() -> None:
    namespace: dict[str, object] = {}
    exec("from safedma import *", namespace)
    assert set(safedma.__all__) <= set(namespace)
    assert set(safedma.__all__) | {"__version__"} <= set(dir(safedma))


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'RemoteCoppy'"):
        getattr(safedma, "RemoteCoppy")
    with pytest.raises(ImportError):
        exec("from safedma import RemoteCoppy", {})
