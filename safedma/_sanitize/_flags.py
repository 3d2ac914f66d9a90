"""The sanitizer's SMEM output: what the kernel records about its first mistake.

One int32 word array per kernel call (per device). The kernel zeroes it at
its first grid step and writes it at most once, at the first mistake in
program order; the host decodes it after the call (:mod:`._report`).

Layout (word: meaning):

* ``CODE``: 0 (no mistake) or one of the codes below;
* ``SITE``: the process-wide id of the check that fired (:mod:`._sites`);
* ``GAVE_UP``: 1 once a wait spun out after the first mistake (later waits
  no longer spin);
* ``VALUES`` .. : the run-time values of the check (a count, an index ...);
* ``PROGRAM`` .. : the grid step (``pl.program_id`` per grid dimension);
* ``DEVICE`` .. : the device (``lax.axis_index`` per mesh axis in scope).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

__all__ = [
    "CODE",
    "DEADLOCK",
    "DEVICE",
    "DEVICE_ID",
    "GAVE_UP",
    "LEFTOVER",
    "MAX_AXES",
    "MAX_GRID",
    "MAX_VALUES",
    "OUT_OF_BOUNDS",
    "PROGRAM",
    "SEMAPHORE_INDEX",
    "SITE",
    "VALUES",
    "WORDS",
    "Recorder",
]

CODE, SITE, GAVE_UP = 0, 1, 2
VALUES, MAX_VALUES = 3, 6
PROGRAM, MAX_GRID = 9, 3
DEVICE, MAX_AXES = 12, 4
WORDS = 16

DEADLOCK, LEFTOVER, OUT_OF_BOUNDS, SEMAPHORE_INDEX, DEVICE_ID = 1, 2, 3, 4, 5


def _i32(value: object) -> jax.Array:
    asarray = cast("Callable[..., jax.Array]", getattr(jnp, "asarray"))
    return asarray(value, dtype=jnp.int32)


class Recorder:
    """Emits, inside the kernel being traced, the reads and writes of the flags ref."""

    def __init__(self, flags: Any, axes: Sequence[str], grid_rank: int) -> None:
        self.flags = flags
        self.axes = tuple(axes)[:MAX_AXES]
        self.grid_rank = min(grid_rank, MAX_GRID)
        self._full_grid_rank = grid_rank
        self._program: list[jax.Array] = []
        self._device: list[jax.Array] = []

    def where_am_i(self) -> None:
        """Read the grid step and the device once, at the top of the kernel (jax's generic
        interpreter, ``interpret=True``, resolves ``pl.program_id`` only there, not inside
        the branches where a mistake is recorded)."""
        self._program = [_i32(pl.program_id(k)) for k in range(self.grid_rank)]
        self._device = [_i32(lax.axis_index(axis)) for axis in self.axes]

    # ------------------------------------------------------------ grid steps

    def _step_test(self, last: bool) -> jax.Array | None:
        test: jax.Array | None = None
        for axis in range(self._full_grid_rank):
            index = self._program[axis] if axis < len(self._program) else pl.program_id(axis)
            target = pl.num_programs(axis) - 1 if last else 0
            here = index == target
            test = here if test is None else jnp.logical_and(test, here)
        return test

    def at_first_step(self, emit: Callable[[], None]) -> None:
        """``emit`` at the kernel's first grid step (always, without a grid)."""
        _when(self._step_test(last=False), emit)

    def at_last_step(self, emit: Callable[[], None]) -> None:
        """``emit`` at the kernel's last grid step (always, without a grid)."""
        _when(self._step_test(last=True), emit)

    # ------------------------------------------------------------ the words

    def clear(self) -> None:
        for word in range(WORDS):
            self.flags[word] = _i32(0)

    def clean(self) -> jax.Array:
        """Whether no mistake has been recorded yet (a traced bool)."""
        clean: jax.Array = self.flags[CODE] == 0
        return clean

    def spin_limit(self, polls: int, drain_polls: int) -> jax.Array:
        """How long the next wait may spin: ``polls`` while clean, ``drain_polls`` after a
        mistake, 0 once a wait gave up after a mistake."""
        after = jnp.where(self.flags[GAVE_UP] == 0, _i32(drain_polls), _i32(0))
        return jnp.where(self.clean(), _i32(polls), after)

    def record(self, code: int, site: int, values: Sequence[object] = ()) -> None:
        """Record mistake ``code`` at ``site`` unless an earlier one is recorded."""
        words = [_i32(v) for v in values][:MAX_VALUES]

        def write() -> None:
            self.flags[CODE] = _i32(code)
            self.flags[SITE] = _i32(site)
            for k, value in enumerate(words):
                self.flags[VALUES + k] = value
            for k, index in enumerate(self._program):
                self.flags[PROGRAM + k] = index
            for k, index in enumerate(self._device):
                self.flags[DEVICE + k] = index

        _when(self.clean(), write)

    def spun_out(self, site: int, values: Sequence[object]) -> None:
        """A wait spun out: a hang (:data:`DEADLOCK`) if it is the first mistake; after
        an earlier mistake, later waits no longer spin."""
        was_clean = self.clean()
        self.record(DEADLOCK, site, values)

        def give_up() -> None:
            self.flags[GAVE_UP] = _i32(1)

        _when(jnp.logical_not(was_clean), give_up)


def _when(condition: jax.Array | None, emit: Callable[[], None]) -> None:
    if condition is None:
        emit()
        return
    pl.when(condition)(emit)
