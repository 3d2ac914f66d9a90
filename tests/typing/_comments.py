"""The expected-error comments of the type-test corpora, read the way each checker reads them.

One line may carry one comment per checker, each in that checker's own suppression
syntax, so that running any of the five over the corpus by hand agrees with the suite:

    handle.wait_send()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue]  # pyrefly: ignore[missing-attribute]  # ty: ignore[unresolved-attribute]

* mypy:         ``# type: ignore[code, ...]``, first on the comment (mypy reads it only there);
                in the plugin corpus also ``# expect[code]`` / ``# expect[code]: message``
                on the lines above the code (codes named ``safedma-*`` come from the plugin);
* pyright:      ``# pyright: ignore[rule, ...]``;
* basedpyright: reads pyright's comment (as basedpyright itself does); a
                ``# basedpyright: ignore[rule, ...]`` on the line replaces it where the two differ;
* pyrefly:      ``# pyrefly: ignore[code, ...]``;
* ty:           ``# ty: ignore[rule, ...]``.

A checker with no comment on a line expects no error there. Only real comments count
(tokenize), not the same words inside a docstring.
"""

from __future__ import annotations

import dataclasses
import io
import re
import tokenize
from collections.abc import Mapping
from pathlib import Path

CHECKERS = ("mypy", "pyright", "basedpyright", "pyrefly", "ty")

# Each match starts at a "#", so "# basedpyright: ignore" is never read as pyright's.
_IGNORE = re.compile(
    r"#\s*(?P<tool>type|pyright|basedpyright|pyrefly|ty):\s*ignore(?P<names>\[[^\]]*\])?"
)
_TOOL_TO_CHECKER = {
    "type": "mypy",
    "pyright": "pyright",
    "basedpyright": "basedpyright",
    "pyrefly": "pyrefly",
    "ty": "ty",
}
_EXPECT = re.compile(r"^\s*# expect\[(?P<code>[a-z0-9-]+)\](?:: (?P<message>.+))?$")
PLUGIN_CODE_PREFIX = "safedma-"


@dataclasses.dataclass(frozen=True)
class Expectation:
    """What one checker's comment on one line expects; ``column`` is where the comment starts."""

    line: int
    column: int
    names: tuple[str, ...]  # empty for a bare ignore


@dataclasses.dataclass(frozen=True)
class Expected:
    """A ``# expect[code]: message`` comment (plugin corpus), attached to the next code line."""

    line: int
    code: str
    message: str | None  # None: any message with this code


def _names(bracketed: str | None) -> tuple[str, ...]:
    if bracketed is None:
        return ()
    return tuple(name.strip() for name in bracketed[1:-1].split(","))


def _scan(source: str) -> dict[str, dict[int, Expectation]]:
    """``{tool: {line: Expectation}}`` for every suppression comment, as written."""
    found: dict[str, dict[int, Expectation]] = {tool: {} for tool in _TOOL_TO_CHECKER}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT:
            continue
        line, column = token.start
        for match in _IGNORE.finditer(token.string):
            if match["tool"] == "type" and match.start() != 0:
                continue  # mypy reads "# type: ignore" only at the start of the comment
            expectation = Expectation(line, column + match.start(), _names(match["names"]))
            found[match["tool"]].setdefault(line, expectation)
    return found


def comment_expectations(source: str) -> dict[str, dict[int, Expectation]]:
    """Each checker's ``{line: Expectation}`` from the trailing comments (see the module doc)."""
    raw = _scan(source)
    by_checker = {_TOOL_TO_CHECKER[tool]: lines for tool, lines in raw.items()}
    by_checker["basedpyright"] = {**raw["pyright"], **raw["basedpyright"]}
    return by_checker


def mypy_expectations(source: str) -> dict[int, Expectation]:
    return comment_expectations(source)["mypy"]


def pyright_expectations(source: str) -> dict[int, Expectation]:
    return comment_expectations(source)["pyright"]


def plugin_expectations(path: Path) -> list[Expected]:
    """The ``# expect[...]`` comments, each attached to the next line of code."""
    found: list[Expected] = []
    pending: list[tuple[str, str | None]] = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT.match(text)
        if match:
            pending.append((match["code"], match["message"]))
        elif text.strip() and not text.strip().startswith("#"):
            found.extend(Expected(number, code, message) for code, message in pending)
            pending = []
    assert not pending, f"{path.name}: # expect comments after the last line of code"
    return found


def expected_codes(
    path: Path, *, mypy_plugin: bool = False
) -> dict[str, dict[int, frozenset[str]]]:
    """``{checker: {line: codes}}``: every error each checker must report in ``path``, and only those.

    mypy's expectations come from ``# type: ignore[...]`` and, in the plugin corpus, from
    ``# expect[...]`` (the plugin's own ``safedma-*`` codes only when ``mypy_plugin``).
    """
    source = path.read_text()
    result: dict[str, dict[int, frozenset[str]]] = {}
    for checker, lines in comment_expectations(source).items():
        result[checker] = {line: frozenset(e.names) for line, e in lines.items()}
    for expected in plugin_expectations(path):
        if expected.code.startswith(PLUGIN_CODE_PREFIX) and not mypy_plugin:
            continue
        result["mypy"][expected.line] = result["mypy"].get(expected.line, frozenset()) | {
            expected.code
        }
    return result


def strip_expectations(source: str) -> str:
    """The source without any trailing expected-error comment (each line cut where its first one
    starts); line numbers are unchanged, so a checker's report on the result lines up with the
    comments of the original."""
    lines = source.splitlines(keepends=True)
    first: dict[int, int] = {}
    for expectations in _scan(source).values():
        for line, e in expectations.items():
            first[line] = min(first.get(line, e.column), e.column)
    for line, column in first.items():
        lines[line - 1] = lines[line - 1][:column].rstrip() + "\n"
    return "".join(lines)


def code_at(path: Path, line: int) -> str:
    """The code on ``line`` of ``path`` without its comment, for naming a line stably."""
    text = path.read_text().splitlines()[line - 1]
    return text.split("#", 1)[0].strip()


def describe(expected: Mapping[int, frozenset[str]]) -> str:
    return ", ".join(f"{line}: {sorted(codes)}" for line, codes in sorted(expected.items()))
