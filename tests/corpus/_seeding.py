"""Seeding a mistake into a kernel we do not own (jax's own kernels, read from the
installed package): :class:`DropWait` stands in for the kernel module's ``pltpu`` and
drops one DMA wait at trace time; :func:`unjitted` gets past jit's cache so the seeded
module is traced afresh."""

from __future__ import annotations

from typing import Any


class DropWait:
    """``pltpu`` with the ``drop``-th DMA ``wait()`` traced through it (from 0) left out.

    Install it as a kernel module's ``pltpu`` (``monkeypatch.setattr(module,
    "pltpu", DropWait(pltpu, 0))``); everything else passes through.
    """

    def __init__(self, real: Any, drop: int) -> None:
        self._real = real
        self._drop = drop
        self.waits = 0
        self.dropped = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def _wrap(self, descriptor: Any) -> Any:
        return _Descriptor(descriptor, self)

    def make_async_copy(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(self._real.make_async_copy(*args, **kwargs))

    def make_async_remote_copy(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(self._real.make_async_remote_copy(*args, **kwargs))

    def async_copy(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(self._real.async_copy(*args, **kwargs))

    def async_remote_copy(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrap(self._real.async_remote_copy(*args, **kwargs))

    def take(self) -> bool:
        """Count one wait; True if it is the one to drop."""
        index = self.waits
        self.waits += 1
        if index == self._drop:
            self.dropped = True
            return True
        return False


class _Descriptor:
    def __init__(self, real: Any, owner: DropWait) -> None:
        self._real = real
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def start(self, *args: Any, **kwargs: Any) -> Any:
        self._real.start(*args, **kwargs)
        return self

    def wait(self) -> Any:
        if self._owner.take():
            return None
        return self._real.wait()


def unjitted(fn: Any) -> Any:
    """The Python function behind a ``jax.jit``: each call traces afresh, so a bug seeded
    into its module after an earlier trace is not hidden by jit's cache."""
    return getattr(fn, "__wrapped__", fn)
