"""How a kernel's buffers and semaphores are named in messages: verify's rule, which
simulate applies too (``safedma/testing/_kernel_names.py``).

A parameter is named as its ``def`` names it (``sems``); one element of a semaphore
array by its position (``sems[1]``, ``grid_sems[0, 2]``); a parameter of a kernel
written ``def kernel(*args)`` by its role among the call's operands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["element_name", "parameter_names"]


def parameter_names(
    names: tuple[str, ...], avals: list[Any], groups: tuple[tuple[str, int], ...]
) -> tuple[list[str], list[bool]]:
    """Each kernel parameter's name for messages, and whether its ``def`` named it.

    Why: a kernel written as ``def kernel(*args)`` (vLLM's RPA forwards its
    operands that way) has no parameter names, and "operand 16" does not tell
    the author which buffer a message is about. Such a parameter is named by
    its role among the call's operands (``groups``: role, count, in order), its
    position and its type, e.g. ``scratch 2 (parameter 16: vmem float32[2,128])``.
    """
    by_position: list[str] = []
    if all(n >= 0 for _, n in groups) and sum(n for _, n in groups) == len(avals):
        for role, count in groups:
            by_position.extend(f"{role} {k}" for k in range(count))
    else:
        by_position = [f"operand {i}" for i in range(len(avals))]
    result: list[str] = []
    named: list[bool] = []
    for i, aval in enumerate(avals):
        if i < len(names):
            result.append(names[i])
            named.append(True)
            continue
        space = str(getattr(aval, "memory_space", "") or "")
        inner = str(getattr(aval, "inner_aval", aval))
        typed = f"{space} {inner}" if space and "sem" not in inner else inner
        result.append(f"{by_position[i]} (parameter {i}: {typed})")
        named.append(False)
    return result, named


def element_name(name: str, shape: tuple[int, ...], index: int) -> str:
    """Element ``index`` (flat, row-major) of the array parameter ``name`` of ``shape``;
    the parameter itself when it is a scalar."""
    if not shape:
        return name
    position = np.unravel_index(index, shape)
    return f"{name}[{', '.join(str(int(i)) for i in position)}]"
