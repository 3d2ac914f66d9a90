"""Trace-time checks for selecting one semaphore out of an N-D semaphore array.

``sems.at[i, j]`` on a ``(2, 3)`` array is one semaphore; ``sems.at[i]`` is a
row of three, and jax accepts a static index past the end (``sems.at[5]`` on
two semaphores lowers, and the TPU signals whatever lies there). The type
checker rejects the first when the brands are used; these checks catch both
while the kernel is traced, for code the checker did not see.
"""

from __future__ import annotations

from typing import cast

from safedma import _compat
from safedma._errors import SemaphoreIndexError
from safedma._describe import call_site, describe_ref

__all__ = ["check_static_indices", "how_to_select_one"]


def _shape_text(shape: tuple[int, ...]) -> str:
    return f"({shape[0]},)" if len(shape) == 1 else str(shape)


def _index_text(index: object) -> str:
    if isinstance(index, tuple):
        start, size = cast("tuple[int, int]", index)
        return f"pl.ds({start}, {size})"
    value = _compat.static_int(index)
    return "<traced>" if value is None else str(value)


def check_static_indices(sem: object, role: str) -> None:
    """A static position or slice in ``sem``'s ``.at[...]`` must lie inside the array."""
    root_shape, positions = _compat.view_selections(sem)
    for dim, index, size in positions:
        if isinstance(index, tuple):
            start, length = cast("tuple[int, int]", index)
            if 0 <= start and start + length <= size:
                continue
            shown = f"pl.ds({start}, {length})"
        else:
            value = _compat.static_int(index)
            if value is None or 0 <= value < size:
                continue
            shown = str(value)
        raise SemaphoreIndexError(
            f"{role} at {call_site()}: index {shown} in dimension {dim} is outside the "
            "semaphore array "
            f"{describe_ref(_compat.root_of(sem))} of shape {_shape_text(root_shape)} (that "
            f"dimension has {size}: valid 0 to {size - 1}). jax does not check this, and the "
            "TPU would signal a semaphore that belongs to something else. Wrap the index "
            f"(% {size}) or declare a larger array (safedma.dma_semaphores(shape))."
        )


def how_to_select_one(sem: object, view_shape: tuple[object, ...]) -> str:
    """The fix for a semaphore array used where one semaphore belongs."""
    root_shape, positions = _compat.view_selections(sem)
    rank = len(root_shape)
    names = ", ".join("ijk"[d] if d < 3 else f"i{d}" for d in range(rank)) or "i"
    fix = f"Select one with sems.at[{names}] (one position per dimension of the {rank}-D array)"
    if sem is _compat.root_of(sem):
        return fix + "."
    given = ", ".join(_index_text(index) for _, index, _ in positions) or "..."
    shown = tuple(int(d) for d in view_shape if isinstance(d, int))
    return (
        f"{fix}: sems.at[{given}] leaves an array of shape {_shape_text(shown)} of the "
        f"array of shape {_shape_text(root_shape)}."
    )
