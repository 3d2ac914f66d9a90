"""Values of verify's lockstep walk: scalars as numpy arrays over the devices.

A scalar of the kernel program is one numpy array holding its value on every device
(a 0-d array when it is the same everywhere); refs are :class:`Ref` (a buffer and the
indexing applied to it); vector data, which verify never computes, is :data:`VEC`.
``SCALAR`` evaluates jax's scalar primitives with jax's integer semantics (C division
and remainder, wrap-around in the result's dtype).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import numpy as np

from safedma.testing._verify import jax_internals as _jax
from safedma.testing._verify.lockstep.model import Bail, DataBuf, SemBuf

__all__ = ["SCALAR", "VEC", "Ref", "Vec", "as_dtype", "is_scalar", "literal"]


class Vec:
    """A value the lockstep path does not compute (vector data, or scalars read from it)."""


VEC = Vec()


class Ref:
    """A buffer and the index steps applied to it (each a tuple of (kind, start, size))."""

    __slots__ = ("buf", "steps")

    def __init__(self, buf: DataBuf | SemBuf, steps: tuple[Any, ...] = ()) -> None:
        self.buf, self.steps = buf, steps


def is_scalar(aval: Any) -> bool:
    return getattr(aval, "shape", None) == () and not _jax.is_ref_aval(aval)


def literal(value: object) -> object:
    """A constant of the program as a lockstep value (VEC unless it is a scalar)."""
    if getattr(value, "shape", None) != () and not isinstance(value, (bool, int, float)):
        return VEC
    try:
        scalar: np.ndarray[Any, Any] = np.asarray(value)
    except Exception:  # a jax value numpy cannot take: not a scalar we know
        return VEC
    return scalar


def as_dtype(value: object, aval: object) -> object:
    """``value`` in the dtype of ``aval`` (jax's result dtype: int32 wraps around)."""
    dtype: object = getattr(aval, "dtype", None)
    if dtype is None or getattr(value, "dtype", None) == dtype:
        return value
    try:
        out: np.ndarray[Any, Any] = np.asarray(value).astype(np.dtype(cast(Any, dtype)))
    except TypeError:
        raise Bail(f"a scalar of dtype {dtype}") from None
    return out


def _int_div(a: Any, b: Any) -> Any:
    if np.issubdtype(np.asarray(b).dtype, np.integer):
        if (np.asarray(b) == 0).any():
            raise Bail("an integer division by zero")
        q: np.ndarray[Any, Any] = np.floor_divide(a, b)
        rounded: np.ndarray[Any, Any] = np.where(
            (np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0)), q + 1, q
        )
        return rounded  # C division: toward zero
    return np.true_divide(a, b)


def _int_rem(a: Any, b: Any) -> Any:
    if np.issubdtype(np.asarray(b).dtype, np.integer) and (np.asarray(b) == 0).any():
        raise Bail("an integer remainder by zero")
    return np.fmod(a, b)


def _not(a: Any) -> Any:
    x: np.ndarray[Any, Any] = np.asarray(a)
    flipped: np.ndarray[Any, Any] = np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)
    return flipped


def _select_n(which: Any, *cases: Any) -> Any:
    index: np.ndarray[Any, Any] = np.asarray(which)
    if len(cases) == 1:
        return cases[0]
    if index.dtype == np.bool_:
        picked: np.ndarray[Any, Any] = np.where(index, np.asarray(cases[1]), np.asarray(cases[0]))
        return picked
    chosen: np.ndarray[Any, Any] = np.choose(index, np.broadcast_arrays(*cases))
    return chosen


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[[Any, list[Any]], Any]:
    return lambda eqn, ins: fn(ins[0], ins[1])


def _unary(fn: Callable[[Any], Any]) -> Callable[[Any, list[Any]], Any]:
    return lambda eqn, ins: fn(ins[0])


def _same(eqn: Any, ins: list[Any]) -> Any:
    return ins[0]


def _integer_pow(eqn: Any, ins: list[Any]) -> Any:
    return np.power(ins[0], int(eqn.params["y"]))


def _clamp(eqn: Any, ins: list[Any]) -> Any:
    return np.minimum(np.maximum(ins[1], ins[0]), ins[2])


SCALAR: dict[str, Callable[[Any, list[Any]], Any]] = {
    "add": _binary(np.add),
    "sub": _binary(np.subtract),
    "mul": _binary(np.multiply),
    "div": _binary(_int_div),
    "rem": _binary(_int_rem),
    "max": _binary(np.maximum),
    "min": _binary(np.minimum),
    "eq": _binary(np.equal),
    "ne": _binary(np.not_equal),
    "lt": _binary(np.less),
    "le": _binary(np.less_equal),
    "gt": _binary(np.greater),
    "ge": _binary(np.greater_equal),
    "and": _binary(np.bitwise_and),
    "or": _binary(np.bitwise_or),
    "xor": _binary(np.bitwise_xor),
    "neg": _unary(np.negative),
    "abs": _unary(np.abs),
    "sign": _unary(np.sign),
    "not": _unary(_not),
    "select_n": lambda eqn, ins: _select_n(*ins),
    "convert_element_type": _same,
    "copy": _same,
    "copy_p": _same,
    "squeeze": _same,
    "reshape": _same,
    "broadcast_in_dim": _same,
    "integer_pow": _integer_pow,
    "clamp": _clamp,
}
