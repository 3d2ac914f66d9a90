"""Copies counted on a REGULAR semaphore (TPU v6 and later).

On TPU v6 and later a DMA can signal a REGULAR semaphore: each finished copy
adds one, and the kernel waits with ``pl.semaphore_wait(sem, n)`` for ``n``
copies instead of by bytes (the census found it in one production kernel).
:class:`CountedCopy` lowers to ``pltpu.make_async_copy(src, dst, flag)``
``.start()`` and its handle's ``wait()`` to ``pl.semaphore_wait(flag, 1)``;
:func:`wait_counted` waits ``n`` such copies at once. jax lowers and compiles
this for every generation, but a TPU v5e runs it into a halted core (measured
with jax 0.10.2): so a counted copy traced for a chip before v6 that this process
runs on is refused at trace time. Interpret mode and compile-only builds for a
topology are not refused (nothing runs on a chip).
"""

from __future__ import annotations

from typing import Any, Literal, final

from safedma import _compat
from safedma._checks import check_data_ref, check_priority, check_same_layout, check_semaphore
from safedma._compat import SemaphoreKind
from safedma._errors import UnsupportedDmaError
from safedma._semaphores import check_amount
from safedma._refs import DataRef, Index, RegularSem
from safedma._describe import describe_ref
from safedma._ledger import HandleState, Side, settle_semaphore
from safedma._public import publish

__all__ = ["CountedCopy", "CountedHandle", "wait_counted"]

_REGULAR = (SemaphoreKind.REGULAR,)
FIRST_COUNTING_GENERATION = 6  # the first TPU whose DMAs signal REGULAR semaphores


@final
class CountedHandle:
    """A started :class:`CountedCopy`; ``wait()`` once (waits for one count)."""

    __slots__ = ("_flag", "_state")

    def __init__(self, flag: RegularSem, state: HandleState) -> None:
        self._flag = flag
        self._state = state

    def wait(self) -> None:
        """Block until the copy has landed (its semaphore reached 1), then take the 1."""
        self._state.record_wait(Side.LOCAL)
        _compat.semaphore_wait(self._flag, 1)


@final
class CountedCopy:
    """A copy on this device that adds 1 to a REGULAR semaphore when it lands."""

    __slots__ = ("_src", "_dst", "_flag")

    def __init__(self, src: DataRef, dst: DataRef, flag: RegularSem) -> None:
        check_data_ref(src, "CountedCopy source")
        check_data_ref(dst, "CountedCopy destination")
        check_same_layout(src, dst, "CountedCopy")
        check_semaphore(flag, "CountedCopy semaphore", _REGULAR, what_for="a counted copy")
        self._src, self._dst, self._flag = src, dst, flag

    @property
    def src(self) -> DataRef:
        return self._src

    @property
    def dst(self) -> DataRef:
        return self._dst

    def _describe(self) -> str:
        return f"CountedCopy {describe_ref(self._src)} -> {describe_ref(self._dst)}"

    def start(self, *, priority: Literal[0, 1] = 0) -> CountedHandle:
        """Start the copy; wait through the handle, or for several with :func:`wait_counted`."""
        check_priority(priority, remote=False)
        _check_chip_counts_copies()
        descriptor: Any = _compat.make_local_descriptor(self._src, self._dst, self._flag)
        sides: dict[Side, object] = {Side.LOCAL: _compat.root_of(self._flag)}
        state = HandleState(self._describe, sides, started_elsewhere=False)
        descriptor.start(priority)
        return CountedHandle(self._flag, state)


def _check_chip_counts_copies() -> None:
    chip = _compat.compiled_for_chip()
    if chip is None:
        return
    generation = _compat.chip_generation(chip)
    if generation is not None and generation < FIRST_COUNTING_GENERATION:
        raise UnsupportedDmaError(
            f"CountedCopy.start(): this kernel is traced for the {chip!r} of this process, "
            f"and a DMA that signals a REGULAR semaphore needs TPU v{FIRST_COUNTING_GENERATION} "
            "or later (on a v5e it compiles and then halts the core). Fix: use a LocalCopy "
            "on a DMA semaphore and wait it by its bytes (wait_bytes / wait_copies for "
            "several copies), or run this kernel on a v6 or later chip."
        )


def wait_counted(flag: RegularSem, count: Index) -> None:
    """Wait for ``count`` counted copies on ``flag``: ``pl.semaphore_wait(flag, count)``.

    Settles every counted copy on ``flag`` for the kernel-scope check, as
    :func:`safedma.wait_bytes` does for DMA semaphores.
    """
    check_semaphore(flag, "wait_counted() semaphore", _REGULAR, what_for="a counted wait")
    check_amount(count, "wait_counted() count")
    settle_semaphore(flag)
    _compat.semaphore_wait(flag, count)


publish(globals(), __name__)  # public classes print as safedma.X
