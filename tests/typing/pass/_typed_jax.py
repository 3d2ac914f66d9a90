"""Typed views of the jax functions the pass files call that jax leaves partly unannotated.

pyright strict reports every use of such a function (reportUnknownMemberType
and friends); mypy has no such check (docs/type-checkers.md, "jax's own
unknowns"). The pass files call these instead, so each of them is clean under
both checkers with every strict rule on. The suppressions live here only, and
reportUnnecessaryTypeIgnoreComment fails the suite once jax types a function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.typing import DTypeLike

C = TypeVar("C")


def fori_loop(
    lower: int | jax.Array,
    upper: int | jax.Array,
    body: Callable[[jax.Array, C], C],
    init: C,
) -> C:
    result = jax.lax.fori_loop(lower, upper, body, init)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return cast(C, result)


def zeros(shape: tuple[int, ...], dtype: DTypeLike) -> jax.Array:
    return jnp.zeros(shape, dtype)  # pyright: ignore[reportUnknownMemberType]


def array(value: int | float, dtype: DTypeLike) -> jax.Array:
    return jnp.array(value, dtype)  # pyright: ignore[reportUnknownMemberType]


def eval_shape(fn: Callable[[jax.Array], jax.Array], x: jax.Array) -> jax.ShapeDtypeStruct:
    shape: jax.ShapeDtypeStruct = jax.eval_shape(fn, x)  # pyright: ignore[reportUnknownMemberType]
    return shape


def buffered_input(spec: pl.BlockSpec, dtype: DTypeLike) -> pltpu.BufferedRef:
    ref: pltpu.BufferedRef = pltpu.BufferedRef.input(spec, dtype)  # pyright: ignore[reportUnknownMemberType]
    return ref


def buffered_output(spec: pl.BlockSpec, dtype: DTypeLike) -> pltpu.BufferedRef:
    ref: pltpu.BufferedRef = pltpu.BufferedRef.output(spec, dtype)  # pyright: ignore[reportUnknownMemberType]
    return ref
