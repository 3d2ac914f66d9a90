"""The code the manual shows inline is the code of the example files the suite runs.

A page shows code inline, so it reads the same on GitHub as in the built site, and
names where the code comes from in a comment just above the block:

    <!-- mirrors examples/first_kernel.py:kernel -->
    ```python
    ...
    ```

``kernel`` is a region of the example file, the lines between ``# --8<-- [start:kernel]``
and ``# --8<-- [end:kernel]`` (dedented). The block must end with the region exactly,
except that runs of blank lines count as one (the formatter that keeps the pages' code
tidy wants two between top-level definitions where the file, nesting them, has one).
The lines above the region, if any, are what the region needs from the top of the
file: each import must import names the file imports from the same module, and each
other line must be a line of the file (a trailing ``# noqa`` left out). Editing an
example without its page, or the page without its example, fails here.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])
MIRROR = re.compile(r"^<!-- mirrors (?P<file>[\w./-]+):(?P<region>[\w-]+) -->\n", re.M)
FENCE = re.compile(r"```[\w-]*\n(?P<code>.*?)^```", re.M | re.S)
NOQA = re.compile(r"\s+# noqa(: [A-Z0-9, ]+)?$")

# Pages whose code is still included at build time rather than shown inline:
# changelog.md includes CHANGELOG.md whole.
INCLUDES_ALLOWED = {"changelog.md"}


def _mirrors() -> list[tuple[Path, str, str, str]]:
    """(page, example file, region, code block) for every mirror comment."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for marker in MIRROR.finditer(text):
            block = FENCE.match(text, marker.end())
            code = block.group("code") if block else ""
            found.append((page, marker.group("file"), marker.group("region"), code))
    return found


MIRRORS = _mirrors()


def region(path: Path, name: str) -> str:
    """The lines of region ``name`` of ``path``, dedented, without the marker lines."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    starts = [i for i, ln in enumerate(lines) if ln.strip() == f"# --8<-- [start:{name}]"]
    ends = [i for i, ln in enumerate(lines) if ln.strip() == f"# --8<-- [end:{name}]"]
    assert len(starts) == 1 and len(ends) == 1 and starts[0] < ends[0], (
        f"{path.relative_to(REPO)} has no single region {name!r}"
    )
    return textwrap.dedent("".join(lines[starts[0] + 1 : ends[0]])).strip("\n") + "\n"


def test_the_manual_mirrors_the_examples() -> None:
    pages = {page.name for page, *_ in MIRRORS}
    assert {"README.md", "getting-started.md", "index.md"} <= pages, pages


@pytest.mark.parametrize(
    ("page", "source", "name", "code"),
    MIRRORS,
    ids=[f"{p.relative_to(REPO)}<-{s}:{n}" for p, s, n, _ in MIRRORS],
)
def test_an_inline_block_equals_the_region_it_mirrors(
    page: Path, source: str, name: str, code: str
) -> None:
    where = f"{page.relative_to(REPO)}, the block mirroring {source}:{name}"
    assert code, f"{where}: no fenced code block right after the comment"
    path = REPO / source
    assert path.is_file(), f"{where}: {source} does not exist"
    wanted = _blank_runs(region(path, name))
    code = _blank_runs(code)
    assert code.endswith(wanted), (
        f"{where} differs from the file; the region is:\n{wanted}\nthe page shows:\n{code}"
    )
    header = code[: len(code) - len(wanted)]
    source_text = path.read_text(encoding="utf-8")
    file_lines = {NOQA.sub("", ln.rstrip()) for ln in source_text.splitlines()}
    file_imports = _imports(ast.parse(source_text).body)
    problems = [f"import {i}" for i in sorted(_imports(ast.parse(header).body) - file_imports)]
    problems += [
        ln
        for ln in header.splitlines()
        if ln.strip() and not ln.startswith(("import ", "from ")) and ln.rstrip() not in file_lines
    ]
    assert not problems, f"{where}: lines above the region that {source} lacks: {problems}"


def _blank_runs(code: str) -> str:
    return re.sub(r"\n{3,}", "\n\n", code)


def _imports(statements: list[ast.stmt]) -> set[str]:
    """``module:name as alias`` for each name the top-level import statements bind."""
    found = set()
    for stmt in statements:
        if isinstance(stmt, ast.Import):
            found |= {f"{a.name} as {a.asname}" for a in stmt.names}
        elif isinstance(stmt, ast.ImportFrom):
            found |= {f"{stmt.module}:{a.name} as {a.asname}" for a in stmt.names}
    return found


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_a_page_shows_its_code_rather_than_including_it(page: Path) -> None:
    """A ``--8<--`` include shows nothing on GitHub, where the README sends readers."""
    if page.name in INCLUDES_ALLOWED:
        return
    text = page.read_text(encoding="utf-8")
    includes = [n for n, ln in enumerate(text.splitlines(), 1) if ln.strip() == "--8<--"]
    assert not includes, f"{page.relative_to(REPO)} includes code at lines {includes}"
