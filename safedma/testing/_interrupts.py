"""Holding interrupts back for the few blocks a simulation must not be cut in half.

A ``KeyboardInterrupt`` (or a signal handler's exception, as pytest-timeout
and ``signal.alarm`` raise) can land between any two bytecodes.  Inside a
first-time jax import, the restoring of patched jax names, or the stopping
of a run, that would leave the process unable to simulate again; everywhere
else simulate handles it.  The deferred signal still reaches its handler,
right after the block.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Generator
from types import FrameType

__all__ = ["deferred_interrupts"]

#: Signals whose handlers commonly interrupt a test: Ctrl-C and notebook
#: interrupts (SIGINT), pytest-timeout's signal method and signal.alarm (SIGALRM).
_INTERRUPTS = (signal.SIGINT, signal.SIGALRM)


@contextlib.contextmanager
def deferred_interrupts() -> Generator[None, None, None]:
    """Hold SIGINT/SIGALRM handlers back for a block that must not be cut in half.

    A deferred signal is handed to its own handler right after the block, so
    the interrupt still happens, just not inside it.  Only the main thread can
    set handlers; elsewhere the block simply runs.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[tuple[int, FrameType | None]] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        pending.append((signum, frame))

    saved = {int(s): signal.getsignal(s) for s in _INTERRUPTS}
    installed = [s for s, handler in saved.items() if callable(handler)]
    for s in installed:
        signal.signal(s, hold)
    try:
        yield
    finally:
        for s in installed:
            signal.signal(s, saved[s])
        for signum, frame in pending[:1]:
            handler = saved[signum]
            if callable(handler):
                handler(signum, frame)
