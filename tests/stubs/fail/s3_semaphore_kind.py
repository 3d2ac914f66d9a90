"""S3: the wrong semaphore kind: REGULAR or BARRIER for a DMA, a DMA semaphore signalled or waited by value."""

from __future__ import annotations

from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import BarrierSem, DataRef, RegularSem, SemRef


def regular_for_dma(x_hbm: DataRef, buf: DataRef, flag: RegularSem, sem: SemRef) -> None:
    pltpu.make_async_copy(x_hbm, buf, flag).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.async_remote_copy(x_hbm, buf, sem, flag, device_id=1)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def barrier_for_dma(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    barrier = pltpu.get_barrier_semaphore()
    pltpu.make_async_copy(x_hbm, buf, barrier).wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.async_remote_copy(x_hbm, buf, barrier, sem, device_id=1)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def dma_sem_by_value(sem: SemRef, barrier: BarrierSem) -> None:
    pl.semaphore_signal(sem)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pl.semaphore_wait(sem, 1)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.core_barrier(sem, core_axis_name="core")  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pl.semaphore_wait(barrier)
