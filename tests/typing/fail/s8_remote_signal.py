"""S8: remote semaphore signals with the asymmetry of S4 (docs/catalogue.md): the target
device given in a form or a place that is not a safedma.Device, or a
semaphore that cannot be signalled remotely.

``safedma.signal(sem, inc, device=dev)`` is the only spelling; a DMA semaphore
is never signalled by hand, and ``wait`` is always local. Each expected error
is the ``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

import safedma
from safedma import RegularSem, SemRef


def device_in_the_wrong_place(flag: RegularSem) -> None:
    right = safedma.neighbour("x")
    # S8: the device given positionally lands in the increment.
    safedma.signal(flag, right)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S8: pltpu's spelling (device_id=) with pltpu's raw id.
    safedma.signal(flag, device_id=(1,))  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[unexpected-keyword]  # ty: ignore[unknown-argument]
    # S8: a raw tuple / dict id where a safedma.Device belongs.
    safedma.signal(flag, device=(1,))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.signal(flag, device={"x": 1})  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def device_without_the_semaphore() -> None:
    # S8: a remote signal with a device and no semaphore.
    safedma.signal(device=safedma.neighbour("x"))  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[missing-argument]  # ty: ignore[missing-argument]


def dma_semaphore_signalled_remotely(sem: SemRef) -> None:
    # S8: a DMA semaphore signalled on another device (only copies signal DMA semaphores).
    safedma.signal(sem, 1, device=safedma.neighbour("x"))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def remote_wait(flag: RegularSem) -> None:
    # S8: waits are local: there is no remote wait.
    safedma.wait(flag, 1, device=safedma.neighbour("x"))  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[unexpected-keyword]  # ty: ignore[unknown-argument]
