"""How safedma names things in its messages: the user's source line, refs, values.

Every message locates a mistake at the author's own line (the first frame
outside safedma's top-level modules) and names refs as the author wrote them
(kernel parameter name, dtype, shape). Descriptions are built only when an
error needs them: formatting them on every ``start()`` was most of safedma's
trace-time cost.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable
from typing import NamedTuple

from safedma import _compat
from safedma._scope import current_scope

__all__ = ["Describe", "SourceLine", "call_site", "describe_ref", "describe_value"]

Describe = Callable[[], str]
"""A description built on demand (only when an error is raised)."""


class SourceLine(NamedTuple):
    """Where user code called safedma; formatted only when an error names it."""

    filename: str
    lineno: int

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


@functools.cache
def _is_library_frame(module_name: str) -> bool:
    # safedma's own top-level modules; safedma.kernels and the like are user code.
    return module_name == "safedma" or (
        module_name.startswith("safedma.") and module_name.count(".") == 1
    )


_LIBRARY_DIR = os.path.dirname(os.path.abspath(__file__))


def is_library_file(path: str) -> bool:
    """The file-path form of the same test, for tracebacks that keep no module names."""
    return os.path.dirname(os.path.abspath(path)) == _LIBRARY_DIR


def call_site() -> SourceLine:
    """The nearest caller outside safedma's own top-level modules (``str()`` is ``file:line``)."""
    frame = sys._getframe(1)  # pyright: ignore[reportPrivateUsage]  # documented CPython API
    while frame.f_back is not None and _is_library_frame(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    return SourceLine(frame.f_code.co_filename, frame.f_lineno)


def describe_value(value: object) -> str:
    """A short, readable rendering of an index or device-id component."""
    if isinstance(value, (int, str)):
        return repr(value)
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return f"<traced {getattr(dtype, 'name', dtype)}>"
    return repr(value)


def describe_ref(ref: object) -> str:
    """A ref as an author recognises it: its kernel parameter name, dtype and shape."""
    scope = current_scope()
    name = scope.name_of(ref) if scope is not None else None
    shape = getattr(ref, "shape", None)
    dtype = getattr(ref, "dtype", None)
    layout = (
        f"{getattr(dtype, 'name', dtype)}[{','.join(str(d) for d in shape)}]"
        if shape is not None
        else type(ref).__name__
    )
    is_view = ref is not _compat.root_of(ref)
    if name is None:
        return layout
    return f"{name}{'.at[...]' if is_view else ''} {layout}"
