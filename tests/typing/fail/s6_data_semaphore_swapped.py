"""S6: data and semaphore swapped (docs/catalogue.md): a semaphore as a copy's source or
destination, a data ref as a semaphore.

pltpu today takes ``Any`` for every parameter and fails late or with
unrelated messages. Each expected error is the ``# type: ignore[code]`` on its
line.
"""

from __future__ import annotations

import safedma
from safedma import BarrierSem, DataRef, RegularSem, SemArray, SemRef


def semaphore_as_data(x_hbm: DataRef, buf: DataRef, sem: SemRef, sems: SemArray) -> None:
    # S6: arguments in the wrong order: the semaphore as the destination ...
    safedma.LocalCopy(x_hbm, sem, buf)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # ... and as the source.
    safedma.LocalCopy(sem, x_hbm, sem)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S6: a semaphore array as the source.
    safedma.LocalCopy(sems, buf, sems.at[0])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def semaphore_as_remote_data(
    x_ref: DataRef, recv: SemRef, flag: RegularSem, barrier: BarrierSem
) -> None:
    # S6: semaphores of any kind as remote copy source / destination.
    safedma.RemoteCopy(flag, x_ref, recv)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.RemoteCopy(x_ref, barrier, recv)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def data_as_semaphore(x_hbm: DataRef, buf: DataRef, other: DataRef, recv: SemRef) -> None:
    # S6: a data ref as the DMA semaphore (local, receive and send side).
    safedma.LocalCopy(x_hbm, buf, other)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.RemoteCopy(x_hbm, buf, other)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.RemoteCopy(x_hbm, buf, recv).with_send_sem(other)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S6: a data ref (or a view of one) to signal / wait / read.
    safedma.signal(other)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.wait(other.at[0])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.read(other)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def semaphore_used_as_an_array(sem: SemRef, o_ref: DataRef) -> None:
    # S6: a semaphore has no data to read or write.
    o_ref[...] = sem[...]  # type: ignore[index]  # pyright: ignore[reportIndexIssue]  # pyrefly: ignore[bad-index]  # ty: ignore[not-subscriptable]
    sem[...] = o_ref[...]  # type: ignore[index]  # pyright: ignore[reportIndexIssue]  # pyrefly: ignore[unsupported-operation]  # ty: ignore[invalid-assignment]
    sem.shape  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
