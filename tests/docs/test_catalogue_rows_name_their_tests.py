"""The catalogue's rows that name their tests (the Pallas GPU rows) name tests that
exist: a renamed or deleted test would leave a row claiming a check nobody runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CATALOGUE = ROOT / "docs" / "catalogue.md"
_CITED = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def _rows() -> dict[str, str]:
    """Each GPU row's code and text, up to the next heading."""
    text = CATALOGUE.read_text(encoding="utf-8")
    parts = re.split(r'<a id="(g\d+)"></a>', text)
    return {code: body.split("\n## ", 1)[0] for code, body in zip(parts[1::2], parts[2::2])}


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def test_the_catalogue_has_its_gpu_rows() -> None:
    assert sorted(_rows(), key=lambda c: int(c[1:])) == [f"g{n}" for n in range(1, 9)]


@pytest.mark.parametrize("code", sorted(_rows()))
def test_each_gpu_row_names_tests_that_exist(code: str) -> None:
    cited = _CITED.findall(_rows()[code])
    assert cited, f"catalogue row {code.upper()} names no test"
    for file, function in cited:
        path = ROOT / file
        assert path.is_file(), f"{code.upper()} cites {file}, which does not exist"
        assert function in _functions(path), f"{code.upper()} cites {file}::{function}"
