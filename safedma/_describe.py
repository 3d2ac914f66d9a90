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

__all__ = [
    "Describe",
    "SourceLine",
    "call_site",
    "copies_of",
    "describe_ref",
    "describe_value",
]

Describe = Callable[[], str]
"""A description built on demand (only when an error is raised)."""


class SourceLine(NamedTuple):
    """Where user code called safedma; formatted only when an error names it.

    ``via``: when that line is in a helper the kernel body called (directly, or from a
    loop body or branch), the user's lines that led there, innermost first, up to the
    kernel body: a helper called from several places is then named at each call.
    """

    filename: str
    lineno: int
    via: tuple[tuple[str, int], ...] = ()

    def __str__(self) -> str:
        here = f"{self.filename}:{self.lineno}"
        if not self.via:
            return here
        return f"{here} (called from {', from '.join(f'{f}:{n}' for f, n in self.via)})"


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


_MAX_VIA_FRAMES = 64
"""How far above the user's line to look for the kernel body (safedma's checked wrapper)."""
_WRAPPER_MODULE = "safedma._entry_points"
_WRAPPER_FUNCTION = "traced"
"""``safedma.checked``'s wrapper, which calls the kernel body (``_entry_points._checked``)."""


def _is_jax_frame(module_name: str) -> bool:
    return module_name.split(".", 1)[0] in ("jax", "jaxlib")


def call_site() -> SourceLine:
    """The nearest caller outside safedma's own top-level modules (``str()`` is ``file:line``),
    with the user's calls that led there from the kernel body (see :class:`SourceLine`)."""
    frame = sys._getframe(1)  # pyright: ignore[reportPrivateUsage]  # documented CPython API
    while frame.f_back is not None and _is_library_frame(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    site = (frame.f_code.co_filename, frame.f_lineno)
    # The user's frames between this line and safedma's checked wrapper (the kernel body's
    # caller), skipping jax's (loop bodies, branches). No wrapper above (a body traced
    # without safedma.checked, a call outside any kernel), or another safedma frame first:
    # the line alone.
    via: list[tuple[str, int]] = []
    outer = frame.f_back
    for _ in range(_MAX_VIA_FRAMES):
        if outer is None:
            return SourceLine(*site)
        module = outer.f_globals.get("__name__", "")
        if _is_library_frame(module):
            if module != _WRAPPER_MODULE or outer.f_code.co_name != _WRAPPER_FUNCTION:
                return SourceLine(*site)
            break
        if not _is_jax_frame(module) and not module.startswith("functools"):
            via.append((outer.f_code.co_filename, outer.f_lineno))
        outer = outer.f_back
    else:
        return SourceLine(*site)
    # A call made in the kernel body itself has no user frame between it and the
    # wrapper: the line alone.
    return SourceLine(site[0], site[1], tuple(via))


def copies_of(count: int, noun: str = "copies") -> str:
    """The prefix of a message line that stands for ``count`` identical items (same
    description, same start site): ``""`` for one, ``"16 copies of "`` for 16."""
    return "" if count == 1 else f"{count} {noun} of "


def describe_value(value: object) -> str:
    """A short, readable rendering of an index or device-id component."""
    if isinstance(value, (int, str)):
        return repr(value)
    dtype = getattr(value, "dtype", None)
    if dtype is not None:
        return f"<traced {getattr(dtype, 'name', dtype)}>"
    return repr(value)


def _dims(shape: tuple[object, ...]) -> list[str]:
    # A size known only at run time (``pl.ds(0, n)`` with a traced ``n``) is ``?``,
    # not the tracer's repr.
    # A numpy int is a size fixed while tracing too (jax's ``core.is_dim``).
    return [str(d) if _compat.is_static_size(d) else "?" for d in shape]


def shape_text(shape: tuple[object, ...]) -> str:
    """A shape as a Python tuple reads, ``(8, 128)`` or ``(128,)``; run-time sizes are ``?``."""
    dims = _dims(shape)
    return f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"


def describe_ref(ref: object) -> str:
    """A ref as an author recognises it: its kernel parameter name, dtype and shape."""
    scope = current_scope()
    name = scope.name_of(ref) if scope is not None else None
    shape = getattr(ref, "shape", None)
    dtype = getattr(ref, "dtype", None)
    layout = (
        f"{getattr(dtype, 'name', dtype)}[{','.join(_dims(tuple(shape)))}]"
        if shape is not None
        else type(ref).__name__
    )
    is_view = ref is not _compat.root_of(ref)
    if name is None:
        return layout
    return f"{name}{'.at[...]' if is_view else ''} {layout}"
