"""Waits in branches: a copy waited once on every path, in whichever branch (``lax.cond``,
``pl.when`` and its complement) a device takes.

* a handle waited once in each branch of ``lax.cond``; the bug's odd branch forgets it
  (R2; a correct kernel the trace-time checks once rejected, written for this suite);
* the same with ``pl.when(c)`` and ``pl.when(~c)``; the bug's second condition overlaps
  the first on device 2, which waits twice and hangs (R3).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from tests.corpus._blocks import AXIS, Pair, caught, dma, sanitized
from tests.corpus._case import Case

D = sd.DataRef
S = sd.SemRef


def cond_each_branch_pltpu(x_ref: Any, o_ref: Any, sem: Any, *, bug: bool) -> None:
    """The copy is waited once on every path, in whichever branch the device takes; the
    bug's odd branch forgets the wait."""
    c = pltpu.make_async_copy(x_ref, o_ref, sem)
    c.start()  # fix: cond_each_branch
    me = lax.axis_index(AXIS)

    def even() -> None:
        c.wait()

    def odd() -> None:
        if not bug:
            c.wait()

    lax.cond(me % 2 == 0, even, odd)


def cond_each_branch_safedma(x_ref: D, o_ref: D, sem: S, *, bug: bool) -> None:
    handle = sd.LocalCopy(x_ref, o_ref, sem).start()  # fix: cond_each_branch

    def wait() -> None:  # a branch returns nothing; handle.wait() returns the buffer
        handle.wait()

    lax.cond(sd.my_index(AXIS) % 2 == 0, wait, (lambda: None) if bug else wait)


def when_not_when_pltpu(x_ref: Any, o_ref: Any, sem: Any, *, bug: bool) -> None:
    """The bug's second condition overlaps the first on device 2: it waits twice and hangs."""
    c = pltpu.make_async_copy(x_ref, o_ref, sem)
    c.start()
    me = lax.axis_index(AXIS)
    even = me % 2 == 0

    @pl.when(even)
    def _even() -> None:
        c.wait()  # fix: when_not_when

    @pl.when(me >= 1 if bug else jnp.logical_not(even))
    def _odd() -> None:
        c.wait()  # fix: when_not_when


def when_not_when_safedma(x_ref: D, o_ref: D, sem: S, *, bug: bool) -> None:
    handle = sd.LocalCopy(x_ref, o_ref, sem).start()
    me = sd.my_index(AXIS)
    even = me % 2 == 0

    def wait() -> None:
        handle.wait()  # fix: when_not_when

    pl.when(even)(wait)  # fix: when_not_when
    # The bug's second condition overlaps the first on device 2: it waits twice.
    pl.when(me >= 1 if bug else jnp.logical_not(even))(wait)  # fix: when_not_when


PAIRS = (
    Pair(
        "cond_each_branch",
        "R2",
        "false_alarm",
        lambda: dma(),
        cond_each_branch_safedma,
        cond_each_branch_pltpu,
        caught(
            r"Leftover|Race",
            r"(?i)not back to zero|never waited|race",
            ("x=1", "x=3"),
            ("sem", "o_ref"),
            r"(?i)wait",
        ),
        simulate_bug="RaceDetectedError",
        # The copy of the branch that skips its wait is left on sem at exit.
        sanitize_bug=sanitized("LeftoverSemaphoreError", ("x=1", "x=3"), ("sem",), line=False),
    ),
    Pair(
        "when_not_when",
        "R3",
        "false_alarm",
        lambda: dma(),
        when_not_when_safedma,
        when_not_when_pltpu,
        caught(
            r"Unsatisfiable|Deadlock",
            r"(?i)never|deadlock|blocked",
            ("x=2",),
            ("sem",),
            r"(?i)wait|start|signal",
        ),
        simulate_bug="UnsatisfiableWaitError",
        sanitize_bug=sanitized("DeadlockError", ("x=2",), ("sem",)),
    ),
)

CASES: list[Case] = [c for pair in PAIRS for c in pair.cases("branches")]
