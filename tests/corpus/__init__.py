"""The corpus: kernels and seeded mistakes, once, by DMA pattern, with each tool's verdict.

Every module but the private ones is one pattern family and defines ``CASES``; the
schema is in ``_case.py``, how each tool runs a program in ``_run.py``, and the drivers
that read the corpus in ``tests/tools/``. README.md says how to add a case or a tool.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Iterable
from typing import Any

from tests.corpus._case import Case, Raises

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
    ``slow`` where the case says so for this tool; ``safedma_verify_expected`` with the
    error verify reports, where another tool runs a program verify rejects, so that
    ``pytest --safedma-verify`` expects that finding instead of failing the test)."""
    import pytest

    chosen = cases(tool) if selected is None else [c for c in selected if tool in c.expect]
    return [pytest.param(c, id=c.name, marks=_marks(c, tool)) for c in chosen]


def _marks(case: Case, tool: str) -> list[Any]:
    import pytest

    marks = [pytest.mark.slow] if tool in case.slow else []
    verdict = case.expect.get("verify")
    if tool != "verify" and isinstance(verdict, Raises):
        # A program verify rejects only at trace time never runs: nothing to expect.
        expected = _verify_error_classes(verdict.error)
        if expected:
            marks.append(pytest.mark.safedma_verify_expected(*expected))
    return marks


def _verify_error_classes(pattern: str) -> list[str]:
    """The run-time error classes of ``safedma.testing`` whose names ``pattern`` matches,
    as the corpus checks a verdict (``re.search`` over class names)."""
    import safedma.testing

    return [
        name
        for name in safedma.testing.__all__
        if isinstance(getattr(safedma.testing, name), type)
        and issubclass(getattr(safedma.testing, name), Exception)
        and re.search(pattern, name)
    ]
