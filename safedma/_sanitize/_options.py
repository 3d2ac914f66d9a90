"""Whether a kernel is sanitized, and how long a wait may spin before it counts as hung.

Off by default. On by ``sanitize=True`` (or a :class:`SanitizeOptions`) on
``sd.pallas_call``, by ``@sd.checked(sanitize=True)`` on the body, or for every
safedma entry point by the environment variable ``SAFEDMA_SANITIZE=1``; an
explicit ``sanitize=False`` turns it off for one call whatever the environment
says. ``SAFEDMA_SANITIZE_HANG_S`` sets :attr:`SanitizeOptions.hang_after_s`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Generator
from typing import ParamSpec, TypeAlias, TypeVar

from safedma._arguments import check_int, check_number, environment_switch, shown
from safedma._public import publish

__all__ = [
    "ENV_HANG",
    "environment_ignored",
    "sees_the_program_as_written",
    "ENV_SWITCH",
    "POLL_NS_CHIP",
    "POLL_S_INTERPRET",
    "Sanitize",
    "SanitizeOptions",
    "requested",
    "resolve",
]

ENV_SWITCH = "SAFEDMA_SANITIZE"
ENV_HANG = "SAFEDMA_SANITIZE_HANG_S"

#: One ``pl.semaphore_read`` poll in a spin loop on a TPU v5e: about 12 ns
#: (10^6 polls 12.8 ms, 10^7 polls 121 ms, measured on the chip).
POLL_NS_CHIP = 12.0
#: One poll in interpret mode when the count has not moved: the read blocks up to
#: 1 ms for a signal before it answers (a busy poll would starve the device threads).
POLL_S_INTERPRET = 1e-3
#: A spin loop counts in int32 on the chip.
_MAX_POLLS = 2**31 - 1
_SECONDS = "Give a number of seconds, such as 10 or 0.5."
_POLLS = "Give a whole number of polls, or None to count them from hang_after_s."


@dataclasses.dataclass(frozen=True)
class SanitizeOptions:
    """How the sanitizer bounds a wait.

    ``hang_after_s``: how long a wait may spin on its semaphore before it is
    reported as a hang (:class:`~safedma.testing.DeadlockError`) and skipped.
    The default, 10 s, is 40 times what the slowest copy of a 16 GiB buffer
    takes on a v5e (about 0.25 s at 290 GB/s); a wait for another device that
    computes for longer needs more. On the chip a poll takes about 12 ns, so
    10 s is about 8 * 10^8 polls; the count is an int32, so at most about 25 s.
    ``polls`` overrides the count of polls directly (the same number on the
    chip and in interpret mode).

    ``after_error_s``: once one error is recorded, later waits spin at most
    this long (copies started before the error still land and are waited),
    and after one of those runs out, waits no longer spin at all: a kernel
    that went wrong ends within ``hang_after_s + after_error_s``.
    """

    hang_after_s: float = 10.0
    polls: int | None = None
    after_error_s: float = 0.1

    def __post_init__(self) -> None:
        where = "safedma.SanitizeOptions()"
        check_number(self.hang_after_s, "hang_after_s", where, positive=True, fix=_SECONDS)
        if self.polls is not None:
            check_int(self.polls, "polls", where, minimum=1, maximum=_MAX_POLLS, fix=_POLLS)
        check_number(self.after_error_s, "after_error_s", where, minimum=0, fix=_SECONDS)

    def spin_polls(self, interpreted: bool) -> int:
        """How many polls a wait may spin before it counts as hung."""
        if self.polls is not None:
            return self.polls
        return _polls(self.hang_after_s, interpreted)

    def drain_polls(self, interpreted: bool) -> int:
        """How many polls a wait may spin once an error has been recorded."""
        return min(self.spin_polls(interpreted), _polls(self.after_error_s, interpreted))

    def spin_seconds(self, interpreted: bool) -> float:
        """About how long :meth:`spin_polls` polls take (for messages)."""
        per_poll = POLL_S_INTERPRET if interpreted else POLL_NS_CHIP * 1e-9
        return self.spin_polls(interpreted) * per_poll


def _polls(seconds: float, interpreted: bool) -> int:
    per_poll = POLL_S_INTERPRET if interpreted else POLL_NS_CHIP * 1e-9
    return max(0, min(_MAX_POLLS, round(seconds / per_poll)))


Sanitize: TypeAlias = "bool | SanitizeOptions | None"
"""What ``sanitize=`` takes: ``True`` (default options), options, ``False`` (off even
when the environment turns it on) or ``None`` (the environment decides)."""


_ignored: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "safedma_sanitize_environment_ignored", default=False
)

P = ParamSpec("P")
R = TypeVar("R")


@contextlib.contextmanager
def environment_ignored() -> Generator[None, None, None]:
    """Trace kernels in the block as written, whatever ``SAFEDMA_SANITIZE`` says (an
    explicit ``sanitize=`` still applies)."""
    token = _ignored.set(True)
    try:
        yield
    finally:
        _ignored.reset(token)


def sees_the_program_as_written(tool: Callable[P, R]) -> Callable[P, R]:
    """``tool`` (``safedma.testing.verify``, ``simulate``) analyses or simulates the
    program as written: the environment switch does not instrument the kernels it traces
    (verify cannot bound the sanitizer's spin loops; simulate has its own, stricter
    checks)."""

    @functools.wraps(tool)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        with environment_ignored():
            return tool(*args, **kwargs)

    return run


def _environment() -> SanitizeOptions | None:
    if _ignored.get():
        return None
    if not environment_switch(ENV_SWITCH, "sanitize every kernel a safedma entry point runs"):
        return None
    hang = os.environ.get(ENV_HANG, "").strip()
    if not hang:
        return SanitizeOptions()
    try:
        seconds = float(hang)
    except ValueError:
        seconds = math.nan
    if not seconds > 0:
        raise ValueError(
            f"the environment variable {ENV_HANG}={hang!r} is not a positive number of "
            "seconds: set it to how long a sanitized wait may spin, such as 10, or unset it "
            "(10 s)."
        )
    return SanitizeOptions(hang_after_s=seconds)


def resolve(sanitize: Sanitize) -> SanitizeOptions | None:
    """The options a call runs with, or None when it is not sanitized."""
    if sanitize is None:
        return _environment()
    if sanitize is True:
        return SanitizeOptions()
    if sanitize is False:
        return None
    if isinstance(sanitize, SanitizeOptions):  # pyright: ignore[reportUnnecessaryIsInstance]
        return sanitize
    raise TypeError(  # unreachable for typed callers; a user may pass anything
        f"sanitize must be True, False, None or a safedma.SanitizeOptions, got "
        f"{shown(sanitize)}. Pass sanitize=True for the default options."
    )


def requested() -> bool:
    """Whether the environment turns the sanitizer on for every entry point."""
    return _environment() is not None


publish(globals(), __name__)  # public classes print as safedma.X
