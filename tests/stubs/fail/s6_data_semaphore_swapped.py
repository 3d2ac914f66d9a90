"""S6: data and semaphore swapped: a semaphore as a copy's source or destination, data as a semaphore."""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemRef


def swapped(x_hbm: DataRef, buf: DataRef, sem: SemRef, recv_sem: SemRef) -> None:
    pltpu.make_async_copy(x_hbm, sem, buf).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_copy(sem, buf, sem).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.async_remote_copy(x_hbm, buf, x_hbm, recv_sem, device_id=1)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
