"""The expected-error comments of the type-test corpus, read the way the checkers read them.

``# type: ignore[code, ...]`` is mypy's expectation at a line, ``# pyright:
ignore[rule, ...]`` pyright's; both may share one line (mypy's first). Only
real comments count (tokenize), not the same words inside a docstring.
"""

from __future__ import annotations

import dataclasses
import io
import re
import tokenize
from pathlib import Path

_MYPY = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?")
_PYRIGHT = re.compile(r"#\s*pyright:\s*ignore(?P<rules>\[[^\]]*\])?")


@dataclasses.dataclass(frozen=True)
class Expectation:
    """What one checker's comment on one line expects; ``column`` is where the comment starts."""

    line: int
    column: int
    names: tuple[str, ...]  # empty for a bare ignore


def _names(bracketed: str | None) -> tuple[str, ...]:
    if bracketed is None:
        return ()
    return tuple(name.strip() for name in bracketed[1:-1].split(","))


def _scan(source: str, pattern: re.Pattern[str], group: str) -> dict[int, Expectation]:
    found: dict[int, Expectation] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        match = pattern.search(token.string)
        if match is None or (pattern is _MYPY and match.start() != 0):
            continue  # mypy reads "# type: ignore" only at the start of the comment
        line, column = token.start
        found[line] = Expectation(line, column + match.start(), _names(match[group]))
    return found


def mypy_expectations(source: str) -> dict[int, Expectation]:
    return _scan(source, _MYPY, "codes")


def pyright_expectations(source: str) -> dict[int, Expectation]:
    return _scan(source, _PYRIGHT, "rules")


def strip_expectations(source: str) -> str:
    """The source without any expected-error comment (each line cut where its first one starts)."""
    lines = source.splitlines(keepends=True)
    mypy, pyright = mypy_expectations(source), pyright_expectations(source)
    for line in mypy.keys() | pyright.keys():
        column = min(e.column for e in (mypy.get(line), pyright.get(line)) if e is not None)
        lines[line - 1] = lines[line - 1][:column].rstrip() + "\n"
    return "".join(lines)


def code_at(path: Path, line: int) -> str:
    """The code on ``line`` of ``path`` without its comment, for naming a line stably."""
    text = path.read_text().splitlines()[line - 1]
    return text.split("#", 1)[0].strip()
