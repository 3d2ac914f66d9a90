"""The corpus: kernels and seeded mistakes, once, by DMA pattern, with each tool's verdict.

Every module but the private ones is one pattern family and defines ``CASES``; the
schema is in ``_case.py``, how each tool runs a program in ``_run.py``, and the drivers
that read the corpus in ``tests/tools/``. README.md says how to add a case or a tool.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from typing import Any

from tests.corpus._case import Case

FAMILIES = tuple(
    sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
)


def _load() -> tuple[Case, ...]:
    found: list[Case] = []
    for family in FAMILIES:
        module = importlib.import_module(f"{__name__}.{family}")
        for case in module.CASES:
            assert case.pattern == family, f"{case.name}: pattern {case.pattern!r} in {family}.py"
            found.append(case)
    names = [c.name for c in found]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    assert not duplicated, f"corpus case names used twice: {duplicated}"
    return tuple(found)


CASES: tuple[Case, ...] = _load()
BY_NAME = {c.name: c for c in CASES}


def cases(
    tool: str | None = None, *, tags: Iterable[str] = (), pattern: str | None = None
) -> list[Case]:
    """The cases with a verdict for ``tool`` (any, if None), carrying every tag in ``tags``."""
    wanted = frozenset(tags)
    return [
        c
        for c in CASES
        if (tool is None or tool in c.expect)
        and wanted <= c.tags
        and (pattern is None or c.pattern == pattern)
    ]


def params(tool: str, selected: Iterable[Case] | None = None) -> list[Any]:
    """pytest parameters, one per case with a verdict for ``tool`` (id: the case's name;
    ``slow`` where the case says so for this tool)."""
    import pytest

    chosen = cases(tool) if selected is None else [c for c in selected if tool in c.expect]
    return [
        pytest.param(c, id=c.name, marks=[pytest.mark.slow] if tool in c.slow else [])
        for c in chosen
    ]
