"""Checks on the arguments of safedma's public entry points, shared by all of them.

Each check raises at the entry point itself, before jax sees the value, with a
``TypeError`` (a value of the wrong kind) or a ``ValueError`` (the right kind, out of
range or not one of the accepted options) whose message names the function, the
parameter, the value received and the fix. Correct values pass through unchanged.

This module imports neither jax nor numpy: the pytest plugin and the environment
switches use it before jax starts.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar, cast

__all__ = [
    "ENVIRONMENT_NO",
    "ENVIRONMENT_YES",
    "check_bool",
    "check_callable",
    "check_choice",
    "check_instance",
    "check_int",
    "check_number",
    "check_shape",
    "environment_switch",
    "shown",
]

T = TypeVar("T")

_MAX_SHOWN = 80

#: The spellings an on/off environment variable accepts (case and spaces ignored).
ENVIRONMENT_YES: tuple[str, ...] = ("1", "true", "yes", "on")
ENVIRONMENT_NO: tuple[str, ...] = ("0", "false", "no", "off")


def shown(value: object) -> str:
    """``value`` as a message shows it: its type and a repr cut to a line."""
    try:
        text = repr(value)
    except Exception:  # a repr that fails must not hide the error being reported
        text = f"<{type(value).__name__} object>"
    if len(text) > _MAX_SHOWN:
        text = text[: _MAX_SHOWN - 3] + "..."
    return f"{type(value).__name__} {text}"


def _sentence(where: str, parameter: str, expected: str, value: object, fix: str) -> str:
    text = f"{where}: {parameter} must be {expected}, got {shown(value)}."
    return f"{text} {fix}" if fix else text


def check_callable(value: T, parameter: str, where: str, fix: str = "") -> T:
    """``value`` must be callable: a kernel body, a function to run."""
    if not callable(value):
        raise TypeError(
            _sentence(
                where,
                parameter,
                "a function (a callable)",
                value,
                fix or "Pass the function itself, not the result of calling it.",
            )
        )
    return value


def check_bool(value: object, parameter: str, where: str, *, none: bool = False) -> None:
    """``value`` must be ``True`` or ``False`` (or ``None`` when ``none``)."""
    if isinstance(value, bool) or (none and value is None):
        return
    expected = "True, False or None" if none else "True or False"
    raise TypeError(_sentence(where, parameter, expected, value, ""))


def check_int(
    value: object,
    parameter: str,
    where: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    fix: str = "",
) -> int:
    """``value`` must be an int (a NumPy integer too; not a bool) in ``minimum..maximum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(_sentence(where, parameter, "an int", value, fix))
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        if maximum is None:
            expected = f"an int of at least {minimum}"
        elif minimum is None:
            expected = f"an int of at most {maximum}"
        else:
            expected = f"an int from {minimum} to {maximum}"
        raise ValueError(_sentence(where, parameter, expected, value, fix))
    return value


def check_number(
    value: object,
    parameter: str,
    where: str,
    *,
    positive: bool = False,
    minimum: float | None = None,
    fix: str = "",
) -> float:
    """``value`` must be a real number (an int or a float, NumPy's too; not a bool, not NaN);
    ``positive``: above 0; ``minimum``: at least that."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(_sentence(where, parameter, "a number (an int or a float)", value, fix))
    number = float(value)
    if positive and not number > 0:  # NaN too
        raise ValueError(_sentence(where, parameter, "positive (a number above 0)", value, fix))
    if math.isnan(number):
        raise ValueError(_sentence(where, parameter, "a number, not NaN", value, fix))
    if minimum is not None and not number >= minimum:
        raise ValueError(_sentence(where, parameter, f"a number of at least {minimum}", value, fix))
    return number


def check_shape(value: object, parameter: str, where: str, *, fix: str = "") -> tuple[int, ...]:
    """``value`` must be a tuple or list of non-negative ints (an array's shape)."""
    expected = "a tuple of non-negative ints (a shape, such as (8, 128))"
    if isinstance(value, int) and not isinstance(value, bool):
        raise TypeError(
            _sentence(
                where, parameter, expected, value, fix or f"Write ({value},) for one dimension."
            )
        )
    if not isinstance(value, (tuple, list)):
        raise TypeError(_sentence(where, parameter, expected, value, fix))
    dims = cast("Sequence[object]", value)
    for position, dim in enumerate(dims):
        index = getattr(dim, "__index__", None)
        if isinstance(dim, bool) or not (isinstance(dim, int) or callable(index)):
            raise TypeError(
                _sentence(
                    where,
                    parameter,
                    expected,
                    dims,
                    f"Dimension {position} is {shown(dim)}. {fix}",
                ).rstrip()
            )
        if cast("Callable[[], int]", index)() < 0:
            raise ValueError(
                _sentence(
                    where, parameter, expected, dims, f"Dimension {position} is negative. {fix}"
                ).rstrip()
            )
    return tuple(cast("Callable[[], int]", getattr(d, "__index__"))() for d in dims)


def check_choice(value: T, parameter: str, where: str, choices: Sequence[object]) -> T:
    """``value`` must be one of ``choices`` (compared with ``==``, so only hashable
    options such as strings and ``None``)."""
    if not any(
        value is choice or (type(value) is type(choice) and value == choice) for choice in choices
    ):
        listed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise (ValueError if isinstance(value, str) else TypeError)(
            _sentence(where, parameter, f"one of {listed}", value, "")
        )
    return value


def check_instance(
    value: T,
    parameter: str,
    where: str,
    kinds: type | tuple[type, ...],
    expected: str,
    fix: str = "",
) -> T:
    """``value`` must be an instance of ``kinds`` (``expected`` says what that is)."""
    if not isinstance(value, kinds):
        raise TypeError(_sentence(where, parameter, expected, value, fix))
    return value


def environment_switch(name: str, meaning: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the on/off environment variable ``name`` is on: unset, empty or one of
    :data:`ENVIRONMENT_NO` is off, one of :data:`ENVIRONMENT_YES` is on, anything else a
    ``ValueError`` listing both (``meaning``: what turning it on does)."""
    raw = (os.environ if environ is None else environ).get(name, "")
    text = raw.strip().lower()
    if not text or text in ENVIRONMENT_NO:
        return False
    if text in ENVIRONMENT_YES:
        return True
    raise ValueError(
        f"the environment variable {name}={raw!r} is not an on/off value: set it to "
        f"{', '.join(ENVIRONMENT_YES)} ({meaning}), or to {', '.join(ENVIRONMENT_NO)} or "
        "unset it (off)."
    )
