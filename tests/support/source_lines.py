"""The source lines a test expects an error to name (the user's own line).

Shared by the tests that assert a message names a line: a line found in a function's
source by a piece of its text, a line of a test file found by a marker comment, and the
lines of one file an exception was raised through.
"""

from __future__ import annotations

import inspect
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

__all__ = ["line_in", "marker_line", "raising_lines"]


def line_in(function: Callable[..., Any], text: str) -> int:
    """The line number of the first line of ``function``'s source containing ``text``."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def marker_line(path: str, marker: str) -> int:
    """The line number of the first line of file ``path`` carrying ``marker``, skipping
    lines that call this helper (they carry the marker too)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, start=1):
        if marker in line and "marker_line" not in line:
            return number
    raise AssertionError(f"{marker!r} is in no line of {path}")


def raising_lines(err: pytest.ExceptionInfo[BaseException], path: str) -> list[int]:
    """The line numbers of file ``path`` in the traceback of ``err``."""
    return [f.lineno or 0 for f in traceback.extract_tb(err.tb) if f.filename == path]
