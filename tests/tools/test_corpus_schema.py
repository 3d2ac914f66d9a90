"""The corpus itself: names unique (checked on import), every case in its family's module,
every tool with a driver, every verdict that names a line backed by a ``# fix:`` line,
and every mistake pair complete."""

from __future__ import annotations

import collections
from pathlib import Path

from tests import corpus
from tests.corpus._case import TOOLS, Raises

TOOLS_DIR = Path(__file__).parent


def test_every_tool_has_a_driver() -> None:
    for tool in TOOLS:
        assert (TOOLS_DIR / f"test_{tool}_corpus.py").exists(), tool


def test_every_case_names_its_provenance_and_is_run_by_some_tool() -> None:
    for case in corpus.CASES:
        assert case.provenance.strip(), case.name
        assert case.expect, case.name


def test_every_verdict_that_names_a_line_has_a_fix_marker() -> None:
    for case in corpus.CASES:
        if any(isinstance(v, Raises) and v.line for v in case.expect.values()):
            assert case.fix_lines(), case.name


def test_every_mistake_pair_has_four_kernels() -> None:
    pairs = collections.Counter(c.marker for c in corpus.cases(tags=("pair",)))
    assert pairs and set(pairs.values()) == {4}, pairs
