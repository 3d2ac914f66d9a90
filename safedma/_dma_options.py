"""Typed helpers for DMA arguments that production kernels compute: a priority
held in a variable, and a ref chosen at run time (``pl.select_ref``)."""

from __future__ import annotations

from typing import Literal, TypeVar, cast

import jax

from safedma import _compat
from safedma._checks import check_priority
from safedma._compat import SemaphoreKind
from safedma._errors import SemaphoreKindError, CopyShapeMismatchError
from safedma._refs import DataRef, Index, RegularSem, SemRef
from safedma._describe import describe_ref

__all__ = ["priority", "select_ref"]


def priority(value: int) -> Literal[0, 1]:
    """A DMA priority from a variable, as the ``Literal[0, 1]`` that ``start()`` takes.

    Checked here, at trace time: ``value`` must be the Python int 0 or 1 (it is
    fixed when the kernel is compiled; a traced value is rejected).
    ``copy.start(priority=safedma.priority(p))``.
    """
    check_priority(value, remote=False)
    return cast("Literal[0, 1]", value)


B = TypeVar("B", DataRef, SemRef, RegularSem)


def select_ref(index: Index, first: B, second: B, /, *rest: B) -> B:
    """One of several refs of the same kind and layout, chosen by a run-time index.

    ``pl.select_ref(index, first, second, *rest)``: jax supports the result as a
    DMA operand (a source, destination or semaphore). The candidates must be
    all data refs of one shape and dtype, or all semaphores of one kind.
    """
    given = cast(object, index)  # checked at run time too, for unchecked callers
    if isinstance(given, bool) or not isinstance(given, (int, jax.Array)):
        raise TypeError(
            f"select_ref() index must be an int or an integer jax array (which candidate, "
            f"from 0), got {type(given).__name__} {given!r}."
        )
    candidates = (first, second, *rest)
    kinds = {_compat.ref_kind(c) if _compat.is_ref(c) else None for c in candidates}
    if len(kinds) != 1 or None in kinds:
        shown = ", ".join(describe_ref(c) for c in candidates)
        raise SemaphoreKindError(
            f"select_ref() candidates must all be refs of one kind, got {shown}. Select "
            "among data refs or among semaphores of one kind, not a mix."
        )
    layouts = {tuple(map(str, _compat.ref_layout(c)[0])) for c in candidates}
    if len(layouts) != 1 and kinds == {SemaphoreKind.DATA}:
        shown = ", ".join(describe_ref(c) for c in candidates)
        raise CopyShapeMismatchError(
            f"select_ref() candidates must have one shape, got {shown}: the copy's size "
            "would depend on the run-time index. Slice them to one shape with .at[...]."
        )
    return cast(B, _compat.select_ref(index, candidates))
