"""The user's line of a traced equation: one rule for ``verify`` and ``simulate``.

Both tools name an equation by the first frame of its traceback outside jax, the
standard library and safedma's library (``safedma/kernels/`` counts as user
code), with the kernel lines that called it when that frame is a helper's. verify
reads the frames from the jaxpr (``_verify/jax_internals.py`` re-exports these), simulate
from the equations its interpreter runs (``_kernel_lines.py``).
"""

from __future__ import annotations

import os
import sysconfig
from collections.abc import Sequence
from typing import Any

from safedma.testing._descriptor_sites import made_at

__all__ = ["traceback_frames", "user_frame_of"]

# safedma's own package directory (this file is safedma/testing/_user_frames.py)
_LIBRARY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_USER_CODE = os.path.join(_LIBRARY, "kernels") + os.sep


# Python's standard library: a wrapper frame of its own (``contextlib``'s
# ContextDecorator around a ``jax.named_scope``-decorated function, ``functools``)
# is never the user's line; installed packages below it are not stdlib.
_STDLIB = tuple(
    {os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")}
)


# Kernels shipped inside jax itself (jax/experimental/pallas/ops): user code, like
# any kernel, with their helpers' callers and conditions named the same way.
_JAX_KERNELS = f"{os.sep}jax{os.sep}experimental{os.sep}pallas{os.sep}ops{os.sep}"


def _is_library(path: str) -> bool:
    path = os.path.abspath(path)
    if path.startswith(_USER_CODE) or _JAX_KERNELS in path:
        return False
    if path.startswith(_LIBRARY + os.sep):
        return True
    if path.startswith(_STDLIB) and not any(
        f"{os.sep}{d}{os.sep}" in path for d in ("site-packages", "dist-packages")
    ):
        return True
    return f"{os.sep}jax{os.sep}" in path or f"{os.sep}jaxlib{os.sep}" in path


def traceback_frames(source_info: Any) -> list[Any]:
    """The frames jax recorded where an equation was traced, innermost first.

    Why: ``source_info.traceback.frames`` is private to jax; an equation
    inside a ``fori_loop`` or ``pl.when`` body records frames only up to that
    body's trace, so callers add the frames of the enclosing equations.
    """
    tb = getattr(source_info, "traceback", None)
    if tb is None:
        return []
    try:
        return list(tb.frames)
    except Exception:
        return []


def user_frame_of(
    frames: Sequence[Any], whole_kernel: bool = False, guard: bool = False
) -> str | None:
    """ "file:line (function)" of the first of ``frames`` (innermost first) outside jax
    and safedma's library, with the lines that called it when it is a helper of the
    kernel; ``whole_kernel``: the list ends at the kernel function.

    Why: safedma's wrappers bind primitives from safedma/_compat.py, so jax's own
    user-frame filter would name safedma; ``safedma/kernels/`` counts as user code.
    A helper's line is the same for every copy it issues (``_async_copy(src, dst,
    sem)``, a zero-fill helper in another module), so the lines of the kernel that
    called it tell them apart: up to two calling frames, stopping where Pallas
    traced the kernel. ``guard``: also the line of the innermost ``pl.when`` /
    ``lax.cond`` the frame runs under (a copy started in a case it should not be is
    fixed at its condition).
    """
    for i, frame in enumerate(frames):
        if not _is_library(frame.file_name) and "<frozen" not in frame.file_name:
            chain = _kernel_callers(frames, i, True)  # the helper's callers, for its descriptor
            callers = chain if whole_kernel else _kernel_callers(frames, i, False)
            made = _made_note(frame, chain)
            if guard:
                made += _guard_note(frames, i)
            if not callers:
                return f"{frame.file_name}:{frame.line_num} ({frame.function_name}{made})"
            # A caller in the same file by its base name (``kernel.py:236``): short, and
            # a location editors and terminals jump to, as the line to fix often is.
            via = ", ".join(
                f"{os.path.basename(c.file_name)}:{c.line_num} in {c.function_name}"
                if c.file_name == frame.file_name
                else f"{c.file_name}:{c.line_num} in {c.function_name}"
                for c in callers
            )
            return (
                f"{frame.file_name}:{frame.line_num} ({frame.function_name}{made}, called at {via})"
            )
    return None


def _made_note(frame: Any, callers: Sequence[Any]) -> str:
    """``, descriptor made at kernel.py:461`` where the frame starts or waits a copy
    descriptor built on another line, followed through the helper's callers when it
    was passed in (the descriptor's arguments are where a wrong slot, semaphore or
    size is written)."""
    through = tuple((str(c.file_name), int(c.line_num)) for c in callers)
    sites = made_at(str(frame.file_name), int(frame.line_num), through)
    if not sites:
        return ""
    named = (
        f"{os.path.basename(path)}:{n}" if path == frame.file_name else f"{path}:{n}"
        for path, n in sites
    )
    return ", descriptor made at " + ", ".join(named)


# jax frames that run a body only when a condition holds: lax.cond/switch, and
# pl.when (a Python bool runs or skips the body in helpers.py, with no cond; the same
# file holds pl.loop and pl.kernel, which are no conditions)
_CONDITIONALS = f"{os.sep}conditionals.py"
_PALLAS_HELPERS = f"{os.sep}pallas{os.sep}helpers.py"


def _is_conditional(frame: Any) -> bool:
    path = str(frame.file_name)
    if path.endswith(_CONDITIONALS):
        return True
    return path.endswith(_PALLAS_HELPERS) and str(frame.function_name).startswith("when")


def _guard_note(frames: Sequence[Any], first: int) -> str:
    """``, under the condition at kernel.py:395``: the user line that called the
    innermost ``pl.when``/``lax.cond`` around ``frames[first]``, inside the kernel."""
    conditional = False
    for outer in frames[first + 1 :]:
        path = str(outer.file_name)
        if _is_library(path) or "<frozen" in path:
            if path.endswith(_KERNEL_TRACERS) and f"{os.sep}jax{os.sep}" in path:
                return ""
            conditional = conditional or _is_conditional(outer)
            continue
        if conditional:
            return f", under the condition at {os.path.basename(path)}:{outer.line_num}"
    return ""


_MAX_CALLERS = 2
# where Pallas traces a kernel body: frames past these are the code that called the kernel
_KERNEL_TRACERS = (
    f"{os.sep}pallas{os.sep}pallas_call.py",
    f"{os.sep}pallas{os.sep}core.py",
)


# frames that wrap a call without tracing a body: jax's (``@jax.named_scope``, api
# boundaries) and the standard library's (contextlib around a named_scope, functools)
_TRANSPARENT = ("source_info_util.py", "traceback_util.py", "contextlib.py", "functools.py")


def _kernel_callers(frames: Sequence[Any], first: int, whole_kernel: bool) -> list[Any]:
    """User frames that called ``frames[first]`` inside the kernel, innermost first.

    Only direct calls are named: a function run by jax (a ``fori_loop`` or
    ``pl.when`` body) is traced once where it is written, so its line already
    tells it apart, while a helper called from several lines is not. The walk
    ends where Pallas traced the kernel, so the code that called
    ``pallas_call`` is never named (``whole_kernel``: the frames end there). If
    that point is not in the record, only a direct caller in the same file is
    named.
    """
    through_jax = False
    found: list[Any] = []
    for outer in frames[first + 1 :]:
        path = str(outer.file_name)
        if _is_library(path) or "<frozen" in path:
            if path.endswith(_KERNEL_TRACERS) and f"{os.sep}jax{os.sep}" in path:
                return found[:_MAX_CALLERS]
            through_jax = through_jax or not path.endswith(_TRANSPARENT)
            continue
        if not through_jax:
            found.append(outer)
        through_jax = False
    if whole_kernel:
        return found[:_MAX_CALLERS]
    direct = frames[first + 1] if first + 1 < len(frames) else None
    if direct is not None and direct.file_name == frames[first].file_name:
        return [direct]
    return []
