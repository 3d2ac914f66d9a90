"""S8: remote semaphore signals: a DMA semaphore signalled remotely, a device id of the wrong form."""

from __future__ import annotations

from jax.experimental import pallas as pl

from safedma import BarrierSem, RegularSem, SemRef


def remote_signals(sem: SemRef, flag: RegularSem, barrier: BarrierSem) -> None:
    pl.semaphore_signal(sem, device_id={"x": 1})  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pl.semaphore_signal(flag, device_id=1.0)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pl.semaphore_signal(barrier, 1, device_id=[0])  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pl.semaphore_signal(flag, 1.5)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
