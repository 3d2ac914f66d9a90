"""Exact evaluation of scalar primitives (program ids, indices, trip counts, predicates).

Values are Python ints, bools and floats; anything else (a vector, a value
read from a semaphore or from an SMEM operand given only as a shape) is an
:class:`Unknown` that says where it came from.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Unknown", "VECTOR", "scalar_rule", "convert"]


class Unknown:
    """A value the verifier does not compute; ``why`` names its origin for error messages."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"Unknown({self.why})"


VECTOR = Unknown("vector data")


def _div(a: Any, b: Any) -> Any:
    if isinstance(a, float) or isinstance(b, float):
        return a / b
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _rem(a: Any, b: Any) -> Any:
    if isinstance(a, float) or isinstance(b, float):
        return math.fmod(a, b)
    if b == 0:
        return 0
    return a - _div(a, b) * b


def _select_n(pred: Any, *cases: Any) -> Any:
    return cases[int(pred)]


def _clamp(lo: Any, x: Any, hi: Any) -> Any:
    return min(max(x, lo), hi)


def _shift_right_logical(a: Any, b: Any) -> Any:
    return (a % (1 << 32)) >> b if a < 0 else a >> b


_BINARY: dict[str, Callable[..., Any]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": _div,
    "rem": _rem,
    "max": max,
    "min": min,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b,
    "le": lambda a, b: a <= b,
    "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b,
    "and": lambda a, b: (a and b) if isinstance(a, bool) else a & b,
    "or": lambda a, b: (a or b) if isinstance(a, bool) else a | b,
    "xor": lambda a, b: (a != b) if isinstance(a, bool) else a ^ b,
    "shift_left": lambda a, b: a << b,
    "shift_right_arithmetic": lambda a, b: a >> b,
    "shift_right_logical": _shift_right_logical,
    "pow": lambda a, b: a ** b,
    "atan2": math.atan2,
    "nextafter": np.nextafter,
}

_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": lambda a: -a,
    "abs": abs,
    "sign": lambda a: (a > 0) - (a < 0),
    "not": lambda a: (not a) if isinstance(a, bool) else ~a,
    "floor": math.floor,
    "ceil": math.ceil,
    "round": round,
    "square": lambda a: a * a,
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "stop_gradient": lambda a: a,
    "optimization_barrier": lambda a: a,
    "copy": lambda a: a,
    "copy_p": lambda a: a,
    "multiple_of": lambda a: a,
    "reduce_precision": lambda a: a,
    "squeeze": lambda a: a,
    "reshape": lambda a: a,
    "broadcast_in_dim": lambda a: a,
    "reduce_max": lambda a: a,
    "reduce_min": lambda a: a,
    "reduce_sum": lambda a: a,
    "reduce_or": lambda a: a,
    "reduce_and": lambda a: a,
}


def convert(value: Any, dtype: Any) -> Any:
    """``value`` as a Python scalar of ``dtype``'s kind (truncating to integers like XLA)."""
    kind = np.dtype(dtype).kind
    if kind == "b":
        return bool(value)
    if kind in "iu":
        return int(value)
    return float(value)


def scalar_rule(name: str, params: dict[str, Any]) -> Callable[..., Any] | None:
    """A Python function computing primitive ``name`` on scalars, or None if not tabled."""
    if name in _BINARY:
        return _BINARY[name]
    if name in _UNARY:
        return _UNARY[name]
    if name == "select_n":
        return _select_n
    if name == "clamp":
        return _clamp
    if name == "integer_pow":
        y = int(params["y"])
        return lambda a: a ** y
    if name == "convert_element_type":
        dtype = params["new_dtype"]
        return lambda a: convert(a, dtype)
    if name == "iota":
        return lambda: 0
    return None
