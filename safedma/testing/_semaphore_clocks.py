"""Which signals a semaphore wait is ordered after: the ones it consumes, in arrival order.

jax's interpreter keeps one vector clock per semaphore and core, merging every
signal into it, and a wait takes that whole clock.  Several copies on one DMA
semaphore therefore all count as complete after the wait of any one of them
(jax's TODO: "model happens-before more precisely for the case where
semaphores are over-signaled").  On a TPU a semaphore is a counter: a wait for
n returns once n units have landed, and copies still in flight may not have
(R9 in docs/catalogue.md).  A read of a copy's destination after only the OTHER copies'
waits ran clean, the copy being executed eagerly in the simulation.

:class:`FifoClocks` replaces a semaphore's ``clocks`` list: each signal is kept
as (amount, clock) in arrival order, and a wait for n merges only the clocks
of the first signals that make up n (a signal it consumes in part counts too,
so the rule never orders less than the schedule where copies land in the
order they were issued, a schedule a TPU can run).  ``simulate``'s wait and
signal probes say which of the two is asking (:func:`signalling`,
:func:`waiting`); any other access sees jax's merged clock.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Generator
from typing import Any

import numpy as np

__all__ = ["FifoClocks", "install", "signalling", "waiting"]

_local = threading.local()


def _stack() -> list[tuple[str, object, int]]:
    stack: list[tuple[str, object, int]] | None = getattr(_local, "stack", None)
    if stack is None:
        stack = []
        _local.stack = stack
    return stack


@contextlib.contextmanager
def signalling(semaphore: object, amount: int) -> Generator[None, None, None]:
    """Within: ``semaphore`` (this thread) is adding ``amount`` to a count."""
    stack = _stack()
    stack.append(("signal", semaphore, amount))
    try:
        yield
    finally:
        stack.pop()


@contextlib.contextmanager
def waiting(semaphore: object, value: int) -> Generator[None, None, None]:
    """Within: this thread waits for ``value`` on ``semaphore``; a copy it runs meanwhile
    may signal (a nested :func:`signalling`)."""
    stack = _stack()
    stack.append(("wait", semaphore, value))
    try:
        yield
    finally:
        stack.pop()
        consumed: dict[int, object] | None = getattr(_local, "consumed", None)
        if consumed is not None:
            consumed.pop(id(semaphore), None)


def _copy(clock: Any) -> Any:
    # jax 0.12 has a VectorClock class (copy/update); jax 0.10 plain numpy arrays.
    return clock.copy()


def _merge(into: Any, other: Any) -> None:
    if hasattr(into, "update"):
        into.update(other)
    else:
        np.maximum(into, other, out=into)


class FifoClocks:
    """Stands for a jax ``Semaphore.clocks`` list (one entry per core); see the module doc."""

    def __init__(self, semaphore: object, merged: list[Any]) -> None:
        self._semaphore = semaphore
        self._merged = list(merged)  # jax's own rule: every signal so far
        self._queues: list[collections.deque[list[Any]]] = [collections.deque() for _ in merged]

    def __len__(self) -> int:
        return len(self._merged)

    def _mode(self) -> tuple[str, int] | None:
        stack = _stack()
        if stack and stack[-1][1] is self._semaphore:
            return stack[-1][0], stack[-1][2]
        return None

    def __getitem__(self, core: int) -> Any:
        mode = self._mode()
        if mode is None:
            return self._merged[core]
        kind, amount = mode
        if kind == "signal":
            return None  # jax then stores a copy of the signal's clock: __setitem__
        consumed: dict[int, object] | None = getattr(_local, "consumed", None)
        if consumed is None:
            consumed = {}
            _local.consumed = consumed
        key = id(self._semaphore)
        if key not in consumed:  # jax 0.10 reads the entry twice (assert, then copy)
            consumed[key] = self._consume(int(core), amount)
        return consumed[key]

    def __setitem__(self, core: int, clock: Any) -> None:
        mode = self._mode()
        merged = self._merged[core]
        if merged is None:
            self._merged[core] = _copy(clock)
        else:
            _merge(merged, clock)
        if mode is not None and mode[0] == "signal":
            self._queues[core].append([mode[1], clock])

    def _consume(self, core: int, value: int) -> Any:
        queue = self._queues[core]
        clock: Any = None
        left = value
        while left > 0 and queue:
            piece = queue[0]
            if clock is None:
                clock = _copy(piece[1])
            else:
                _merge(clock, piece[1])
            taken = min(left, int(piece[0]))
            left -= taken
            piece[0] = int(piece[0]) - taken
            if piece[0] <= 0:
                queue.popleft()
        if clock is None:  # counts this record never saw: jax's own rule
            merged = self._merged[core]
            return None if merged is None else _copy(merged)
        return clock


def install(semaphore: Any) -> None:
    """Give ``semaphore`` (a jax interpreter ``Semaphore`` with race detection) FIFO clocks."""
    if isinstance(getattr(semaphore, "clocks", None), FifoClocks):
        return
    # Under the semaphore's own lock, which jax holds while it signals: a device
    # signalling while another installs would otherwise add to the list replaced.
    with semaphore.cv:
        clocks: Any = getattr(semaphore, "clocks", None)
        if clocks is None or isinstance(clocks, FifoClocks):
            return  # race detection off, or installed meanwhile
        semaphore.clocks = FifoClocks(semaphore, list(clocks))
