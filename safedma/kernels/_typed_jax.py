"""Typed views of the jax functions the kernels call that jax leaves partly unannotated.

pyright strict reports every use of such a function (reportUnknownMemberType
and friends; mypy has no such check, docs/type-checkers.md, "jax's own
unknowns"). The kernels call these instead, so the suppressions live here
only, and reportUnnecessaryTypeIgnoreComment fails the suite once jax types
a function. Each is a plain call of the jax function: what is traced, and so
the Mosaic module, is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import jax

__all__ = ["eval_shape", "fori_loop"]

C = TypeVar("C")


def fori_loop(
    lower: int | jax.Array,
    upper: int | jax.Array,
    body: Callable[[jax.Array, C], C],
    init: C,
) -> C:
    """``jax.lax.fori_loop``: ``body(i, carry)`` for ``i`` from ``lower`` to ``upper - 1``."""
    result = jax.lax.fori_loop(lower, upper, body, init)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return cast(C, result)


def eval_shape(fn: Callable[[jax.Array], jax.Array], x: jax.ShapeDtypeStruct) -> object:
    """``jax.eval_shape(fn, x)``: what ``fn`` returns, abstractly (any pytree, if ``fn`` errs)."""
    shape: object = jax.eval_shape(fn, x)  # pyright: ignore[reportUnknownMemberType]
    return shape
