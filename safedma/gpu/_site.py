"""The user's line, for trace-time messages: the first frame outside ``safedma.gpu``."""

from __future__ import annotations

import sys

__all__ = ["user_line"]


def user_line() -> str:
    """``file:line`` of the nearest caller outside this package."""
    frame = sys._getframe(1)  # pyright: ignore[reportPrivateUsage]  # documented CPython API
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith(
        "safedma.gpu"
    ):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}"
