"""Waits by total size on a DMA semaphore shared by many copies.

MoE all-to-all and async collectives start local copies, remote sends and
receive remote copies on *one* DMA semaphore, then wait once for however many
bytes went through it (often a size computed in SMEM). A DMA wait decrements
its semaphore by the byte count of its descriptor, so the raw spelling is a
self-descriptor sized like the total: ``pltpu.make_async_copy(buf, buf,
sem).wait()``. These helpers name that wait, lower to exactly it, and tell
the kernel scope that every copy on the semaphore (every side: local, send,
receive; started before or after in the trace) is accounted for by size: the
trace cannot pair sizes that only exist at run time, so it does not try.
Sizes that do not add up hang on a TPU; the strict simulation in
``safedma.testing`` reports them.
"""

from __future__ import annotations

from typing import Any

from safedma import _compat
from safedma._arguments import check_instance
from safedma._checks import check_data_ref, check_semaphore
from safedma._compat import SemaphoreKind
from safedma._copies import Given, LocalCopy, RemoteCopy
from safedma._errors import SemaphoreKindError
from safedma._refs import DataRef, SemRef
from safedma._describe import describe_ref
from safedma._ledger import record_wait_on, settle_semaphore

__all__ = ["wait_bytes", "wait_copies"]

_DMA = (SemaphoreKind.DMA,)


def wait_bytes(sem: SemRef, like: DataRef) -> None:
    """Wait on ``sem`` for as many bytes as ``like`` holds.

    ``like`` is any data ref (or view) of the total size: the buffer the
    copies filled, or a slice of it sized from SMEM. Lowers to
    ``pltpu.make_async_copy(like, like, sem).wait()``.
    """
    check_semaphore(sem, "wait_bytes() semaphore", _DMA, what_for="a wait by size")
    check_data_ref(like, "wait_bytes() size reference")
    _settle_and_record(sem)
    _compat.make_local_descriptor(like, like, sem).wait()


def _settle_and_record(sem: object) -> None:
    settle_semaphore(sem)
    record_wait_on(sem)  # what a future's done kernel looks for: a wait on its semaphore


def _semaphores_of(copy: object) -> list[object]:
    """The semaphores a copy signals on this device (local: its one; remote: send
    and receive). Read through public properties first, then the private fields."""
    if isinstance(copy, LocalCopy):
        return [copy.sem]
    sems: list[object] = []
    for name in ("recv_sem", "send_sem", "_send_sem"):
        value = getattr(copy, name, None)
        if value is not None and all(value is not s for s in sems):
            sems.append(value)
    return sems


def wait_copies(sem: SemRef, *copies: LocalCopy | RemoteCopy[Given, Given]) -> None:
    """Wait on ``sem`` for the bytes of ``copies``: one wait sized like each copy.

    Each copy must signal ``sem`` (its semaphore, or its send or receive
    semaphore); the copies may have been started here, in an earlier
    iteration, or by another device sending to this one. Lowers to
    ``pltpu.make_async_copy(c.dst, c.dst, sem).wait()`` for each ``c``.
    """
    check_semaphore(sem, "wait_copies() semaphore", _DMA, what_for="a wait by size")
    for k, copy in enumerate(copies):
        check_instance(
            copy,
            f"copy {k + 1}",
            "safedma.wait_copies()",
            (LocalCopy, RemoteCopy),
            "a safedma.LocalCopy or RemoteCopy (the description of a copy, not its handle)",
            "Pass the copies whose bytes the wait stands for: wait_copies(sem, copy_a, copy_b).",
        )
    root = _compat.root_of(sem)
    for copy in copies:
        roots = [_compat.root_of(s) for s in _semaphores_of(copy)]
        if all(r is not root for r in roots):
            raise SemaphoreKindError(
                f"wait_copies(): {type(copy).__name__} {describe_ref(copy.src)} -> "
                f"{describe_ref(copy.dst)} does not signal the waited semaphore "
                f"{describe_ref(sem)}: waiting its size there decrements a semaphore its "
                "bytes never reach, so the kernel hangs. Wait it on its own semaphore."
            )
    _settle_and_record(sem)
    for copy in copies:
        dst: Any = copy.dst
        _compat.make_local_descriptor(dst, dst, sem).wait()
