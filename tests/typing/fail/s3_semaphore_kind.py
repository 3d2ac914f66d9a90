"""S3: the wrong semaphore kind (docs/catalogue.md): a REGULAR or BARRIER semaphore for a
DMA, and a DMA semaphore given to signal/wait.

pltpu today does not check a start; the wait raises "dma_wait requires a DMA
semaphore, but got a regular semaphore". Each expected error is the
``# type: ignore[code]`` on its line.
"""

from __future__ import annotations

import safedma
from safedma import BarrierSem, DataRef, RegularSem, RegularSemArray, SemArray, SemRef


def regular_for_dma(
    x_ref: DataRef, o_ref: DataRef, flag: RegularSem, flags: RegularSemArray, send: SemRef
) -> None:
    # S3: a REGULAR semaphore as a local copy's DMA semaphore.
    safedma.LocalCopy(x_ref, o_ref, flag).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S3: one of a REGULAR array, selected correctly, is still REGULAR.
    safedma.LocalCopy(x_ref, o_ref, flags.at[0]).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S3: REGULAR as a remote copy's receive and send semaphores.
    safedma.RemoteCopy(x_ref, o_ref, flag)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    copy = safedma.RemoteCopy(x_ref, o_ref, send)
    copy.with_send_sem(flag)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def barrier_for_dma(x_ref: DataRef, o_ref: DataRef, recv: SemRef) -> None:
    barrier = safedma.barrier_semaphore()
    # S3: the BARRIER semaphore as a DMA semaphore, local and remote.
    safedma.LocalCopy(x_ref, o_ref, barrier).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    copy = safedma.RemoteCopy(x_ref, o_ref, recv)
    copy.with_send_sem(barrier).to(safedma.neighbour("x")).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def barrier_param_for_dma(x_ref: DataRef, o_ref: DataRef, barrier: BarrierSem) -> None:
    # S3: the same with a BarrierSem-annotated parameter, as a receive semaphore.
    safedma.RemoteCopy(x_ref, o_ref, barrier)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def dma_to_signal_wait(sem: SemRef, sems: SemArray) -> None:
    # S3: a DMA semaphore to signal and wait: DMA semaphores are waited through a handle.
    safedma.signal(sem)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.wait(sem)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.signal(sems.at[1], 2)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    safedma.wait(sems.at[1], 2)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def scratch_of_the_wrong_kind(x_hbm: DataRef, o_hbm: DataRef) -> None:
    def body(sem: SemRef) -> None:
        safedma.LocalCopy(x_hbm, o_hbm, sem).start().wait()

    # S3: run_scoped allocates a REGULAR semaphore for a body that needs a DMA one.
    safedma.run_scoped(body, safedma.regular_semaphore())  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
