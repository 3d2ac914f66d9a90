"""The user's line of a kernel equation, for simulate's messages: verify's rule, one helper.

``verify`` names an equation by the first frame of its traceback outside jax,
the standard library and safedma's library, with the kernel lines that called
it when that frame is a helper's (``_user_frames.user_frame_of``).  jax records
an equation's frames only since the trace of the body it is in began (a loop
body, a ``run_scoped`` body, the kernel), so verify adds the frames of the
equations enclosing it, up to the kernel function.  simulate sees an equation
only at run time, by its ``source_info``; :func:`enclosing_lines` walks the
traced program first and keeps, per traceback, the frames of the equations
around it, so :func:`user_location` applies the same rule to the same frames
and both tools name the same line for the same equation.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Iterable, Sequence
from typing import Any, cast

from safedma.testing import _user_frames

__all__ = ["enclosing_lines", "sub_jaxprs", "user_location"]

#: The primitives whose sub-jaxprs are kernel bodies: there verify's walk
#: restarts (the frames of the kernel call are not the kernel's).
KERNEL_PRIMITIVES = ("pallas_call", "core_map", "mpmd_map")


class _Context:
    """Where an equation sits: the frames of the equations around it, innermost first,
    and whether they reach the kernel function (inside a kernel body)."""

    __slots__ = ("enclosing", "in_kernel", "traceback")

    def __init__(self, traceback: object, enclosing: Sequence[list[Any]], in_kernel: bool) -> None:
        self.traceback = traceback
        self.enclosing = enclosing
        self.in_kernel = in_kernel


#: Per traceback (by id, the traceback kept alive in the entry) of an equation of
#: the program being simulated.  Filled by :func:`enclosing_lines` for one simulate.
_contexts: dict[int, _Context] = {}


def _frames(source_info: object) -> list[Any]:
    return _user_frames.traceback_frames(source_info)


def user_location(source_info: object) -> str | None:
    """``file:line (function)`` of the user's frame of an equation, as verify names it.

    jax's own ``summarize`` stops at the first frame outside jax, which for a
    copy built with safedma is safedma's wrapper; safedma's frames are skipped
    here rather than registered with jax (``source_info_util.register_exclusion``),
    which would also drop them from every traceback jax filters in the process.
    An equation of the simulated program is named with the frames of the
    equations around it (see :func:`enclosing_lines`); any other by its own.
    """
    if source_info is None:
        return None
    try:
        frames = _frames(source_info)
        traceback = getattr(source_info, "traceback", None)
        context = _contexts.get(id(traceback))
        in_kernel = False
        if context is not None and context.traceback is traceback:
            for outer in context.enclosing:
                frames.extend(outer)
            in_kernel = context.in_kernel
        return _user_frames.user_frame_of(frames, whole_kernel=in_kernel)
    except Exception:  # only for messages; never let it break a run
        return None


def sub_jaxprs(value: object) -> Iterable[Any]:
    """The jaxprs held by an equation parameter (a jaxpr, a ClosedJaxpr, or lists of them)."""
    if isinstance(value, (tuple, list)):
        for item in cast("Sequence[object]", value):
            yield from sub_jaxprs(item)
        return
    inner = getattr(value, "jaxpr", None)  # a ClosedJaxpr
    if inner is not None and hasattr(inner, "eqns"):
        yield inner
    elif hasattr(value, "eqns"):
        yield value


def _register(
    jaxpr: Any, enclosing: tuple[list[Any], ...], in_kernel: bool, seen: set[int]
) -> None:
    if id(jaxpr) in seen:  # a sub-jaxpr shared by several equations: its first user wins
        return
    seen.add(id(jaxpr))
    for eqn in getattr(jaxpr, "eqns", ()):
        info = getattr(eqn, "source_info", None)
        traceback = getattr(info, "traceback", None)
        if traceback is not None and id(traceback) not in _contexts:
            _contexts[id(traceback)] = _Context(traceback, enclosing, in_kernel)
        subs = [sub for value in getattr(eqn, "params", {}).values() for sub in sub_jaxprs(value)]
        if not subs:
            continue
        inner: tuple[list[Any], ...] = ()
        kernel = True  # a kernel body's frames end at the kernel function
        if getattr(getattr(eqn, "primitive", None), "name", None) not in KERNEL_PRIMITIVES:
            inner, kernel = (_frames(info), *enclosing), in_kernel
        for sub in subs:
            _register(sub, inner, kernel, seen)


@contextlib.contextmanager
def enclosing_lines(jaxpr: object) -> Generator[None, None, None]:
    """While simulating ``jaxpr``: its equations are named with the frames around them."""
    try:
        try:
            _register(jaxpr, (), False, set())
        except Exception:  # only for messages; never let it break a run
            pass
        yield
    finally:
        _contexts.clear()
