"""safedma.gpu under the type checkers: the example is clean, and each mistake in
tests/gpu/typing/gpu_mistakes.py is reported at its line with the code written there.

mypy --strict and pyright strict run with the project's configuration (through the
type-test corpus's runner, tests/typing/_checkers.py); each expected error is written on
its line as ``# expect: mypy[code] pyright[rule,...]``, and the set of (line, code) each
checker reports must equal the set written.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from safedma import gpu

# Collected and skipped (not skipped at import): the lanes name these tests, and a
# pattern that matches nothing stops the run (tests/support/fast_lane.py).
pytestmark = pytest.mark.skipif(
    not gpu.available(),
    reason="this jax has no Pallas Mosaic GPU API that safedma.gpu lowers to; its "
    "signatures are what the checkers read",
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "gpu_double_buffer.py"
MISTAKES = Path(__file__).resolve().parent / "typing" / "gpu_mistakes.py"
_EXPECT = re.compile(r"# expect: (.*)$")
_CHECKER = re.compile(r"(mypy|pyright)\[([^\]]*)\]")


def _checkers() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "_gpu_checkers", REPO / "tests" / "typing" / "_checkers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def _expected(checker: str) -> set[tuple[int, str]]:
    found: set[tuple[int, str]] = set()
    for number, text in enumerate(MISTAKES.read_text().splitlines(), 1):
        match = _EXPECT.search(text)
        if match is None or text.lstrip().startswith("``"):
            continue
        for name, codes in _CHECKER.findall(match.group(1)):
            if name == checker:
                found |= {(number, code) for code in codes.split(",")}
    return found


@pytest.fixture(scope="module")
def runner() -> ModuleType:
    checkers = _checkers()
    for name in ("mypy", "pyright"):
        try:
            checkers.executable(name)
        except checkers.CheckerMissing as err:
            pytest.skip(str(err))
    return checkers


@pytest.mark.parametrize("checker", ["mypy", "pyright"])
def test_the_example_and_the_layer_are_clean(runner: ModuleType, checker: str) -> None:
    run = runner.run(checker, [EXAMPLE, REPO / "safedma" / "gpu"], runner.Setup(cache="gpu"))
    assert [d.render() for d in run.errors] == []


@pytest.mark.parametrize("checker", ["mypy", "pyright"])
def test_each_mistake_is_reported_at_its_line(runner: ModuleType, checker: str) -> None:
    run = runner.run(checker, [MISTAKES], runner.Setup(cache="gpu"))
    reported = {(d.line, d.code) for d in run.for_path(MISTAKES)}
    expected = _expected(checker)
    assert len(expected) >= 6
    assert reported == expected, "\n".join(d.render() for d in run.errors)
