"""Exact evaluation of scalar primitives (program ids, indices, trip counts, predicates).

Values are Python ints, bools and floats; anything else (a vector, a value
read from a semaphore or from an SMEM operand given only as a shape) is an
:class:`Unknown` that says where it came from.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["Partial", "Unknown", "VECTOR", "scalar_rule", "convert"]


class Unknown:
    """A value the verifier does not compute; ``why`` names its origin for error messages."""

    __slots__ = ("why",)

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return f"Unknown({self.why})"


VECTOR = Unknown("vector data")


class Partial(Unknown):
    """A vector some of whose elements are known: ``values`` holds them (the rest are
    placeholders), ``known`` marks which. What a kernel loads from a buffer it filled
    only in part (a row count copied into element 0 of a 16-lane scratch, the whole
    scratch loaded, element 0 taken); ``why`` names where the unknown elements came from.
    Slicing out known elements gives an exact value again."""

    __slots__ = ("values", "known")

    def __init__(self, why: str, values: Any, known: Any) -> None:
        super().__init__(why)
        self.values = values
        self.known = known


class Computed(Unknown):
    """A value an operation of the program computed from data the verifier lacks; its
    ``why`` names that operation, its line and where its input came from."""

    __slots__ = ()


def lost_by(name: str, where: Callable[[], str], base: Unknown) -> Unknown:
    """What operation ``name`` (at ``where()``) outputs from unknown input ``base``: the
    first operation that lost the value is named (docs/verify.md, values computed by
    the program); plain vector data and garbage stay as they are."""
    if base is VECTOR or isinstance(base, (Garbage, Computed)):
        return base
    return Computed(f"the value computed by `{name}` at {where()} from {base.why}")


class Garbage(Unknown):
    """Vector data loaded from a region nothing wrote, or computed from such data element
    by element with no way to mask it (moves, casts, sums, unary math: ``GARBAGE_KEEPING``).

    Stored into a buffer, it makes that region garbage again, so R6 is reported where it
    leaves the kernel (docs/verify-model.md, rule 12). ``jnp.where`` and products are not
    followed: kernels mask padding with them, and the masked value is data."""

    __slots__ = ("note", "root")

    def __init__(self, why: str, note: str, root: str) -> None:
        super().__init__(why)
        self.note = note  # "data loaded at L from buf[box], which nothing wrote (...)"
        self.root = root  # the buffer nothing wrote that it came from

    def origin(self) -> Unknown:
        """The plain unknown value it stands for where it is not followed."""
        return Unknown(self.why)


# Primitives whose every output element is garbage when an input element it reads is:
# data movement, casts, sums and differences, and unary math (no operand can mask it).
GARBAGE_KEEPING = frozenset(
    {
        "reshape",
        "squeeze",
        "expand_dims",
        "broadcast_in_dim",
        "transpose",
        "rev",
        "slice",
        "dynamic_slice",
        "copy",
        "copy_p",
        "convert_element_type",
        "bitcast_convert_type",
        "reduce_precision",
        "bitcast",  # pltpu.bitcast: the same bits, repacked
        "roll",  # pltpu.roll: a rotation of the whole value
        "add",
        "sub",
        "neg",
        "abs",
        "exp",
        "exp2",
        "log",
        "log1p",
        "expm1",
        "tanh",
        "logistic",
        "sqrt",
        "rsqrt",
        "sin",
        "cos",
        "erf",
        "floor",
        "ceil",
        "round",
    }
)


def unknown_result(name: str, vals: list[Any]) -> Unknown:
    """What a vector op outputs when it cannot be computed: garbage kept by
    ``GARBAGE_KEEPING`` primitives, else the first unknown input (its origin names a
    load for data-dependent control flow), else plain vector data."""
    why: Unknown | None = None
    for v in vals:
        if isinstance(v, Garbage):
            if name in GARBAGE_KEEPING:
                return v
            why = why or v.origin()
        elif isinstance(v, Unknown) and v is not VECTOR and why is None:
            why = v
    return why or VECTOR


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


def _and(a: Any, b: Any) -> Any:
    return (a and b) if isinstance(a, bool) else a & b


def _or(a: Any, b: Any) -> Any:
    return (a or b) if isinstance(a, bool) else a | b


def _xor(a: Any, b: Any) -> Any:
    return (a != b) if isinstance(a, bool) else a ^ b


def _not(a: Any) -> Any:
    return (not a) if isinstance(a, bool) else ~a


def _sign(a: Any) -> Any:
    return (a > 0) - (a < 0)


def _square(a: Any) -> Any:
    return a * a


def _lshift(a: Any, b: Any) -> Any:
    return a << b


def _rshift(a: Any, b: Any) -> Any:
    return a >> b


def _pow(a: Any, b: Any) -> Any:
    return a**b


def _same(a: Any) -> Any:
    return a


_BINARY: dict[str, Callable[..., Any]] = {
    "add": operator.add,
    "sub": operator.sub,
    "mul": operator.mul,
    "div": _div,
    "rem": _rem,
    "max": max,
    "min": min,
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "and": _and,
    "or": _or,
    "xor": _xor,
    "shift_left": _lshift,
    "shift_right_arithmetic": _rshift,
    "shift_right_logical": _shift_right_logical,
    "pow": _pow,
    "atan2": math.atan2,
}

_UNARY: dict[str, Callable[[Any], Any]] = {
    "neg": operator.neg,
    "abs": abs,
    "sign": _sign,
    "not": _not,
    "floor": math.floor,
    "ceil": math.ceil,
    "round": round,
    "square": _square,
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    **{
        name: _same
        for name in (
            "stop_gradient",
            "optimization_barrier",
            "copy",
            "copy_p",
            "multiple_of",
            "reduce_precision",
            "squeeze",
            "reshape",
            "broadcast_in_dim",
            "reduce_max",
            "reduce_min",
            "reduce_sum",
            "reduce_or",
            "reduce_and",
        )
    },
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

        def power(a: Any) -> Any:
            return a**y

        return power
    if name == "convert_element_type":
        dtype = params["new_dtype"]
        try:
            kind = np.dtype(dtype).kind
        except TypeError:  # not a numpy dtype (e.g. a PRNG key): fails when run, as before

            def converted(a: Any) -> Any:
                return convert(a, dtype)

            return converted
        to: Callable[[Any], Any] = bool if kind == "b" else int if kind in "iu" else float
        return to
    return None
