"""S1: a semaphore *value* where a semaphore ref belongs, in raw pltpu calls (the seed).

``pl.semaphore_read(sem)`` returns the count (a ``jax.Array``). Without the
stubs pltpu takes ``Any`` and the mistake surfaces at trace time as
"DMA source semaphore must be a Ref."; with them it is a type error.
"""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, RegularSem, SemRef


def seed(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    # The seed scenario, verbatim: the send semaphore is the value pl.semaphore_read returned.
    me = jax.lax.axis_index("x")
    copy = pltpu.make_async_remote_copy(x_ref, o_ref, pl.semaphore_read(send_sem), recv_sem, device_id={"x": (me + 1) % 4})  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    copy.start()
    copy.wait()


def recv_sem_is_a_value(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    value = pl.semaphore_read(recv_sem)
    pltpu.async_remote_copy(x_ref, o_ref, send_sem, value, device_id=0)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def local_sem_is_a_value(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    pltpu.make_async_copy(x_hbm, buf, pl.semaphore_read(sem)).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # Any jax.Array (here a traced index) where the semaphore belongs.
    pltpu.async_copy(x_hbm, buf, jax.lax.axis_index("x"))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def indexed_sem(sem: SemRef, flag: RegularSem) -> None:
    # sem[()] would read a value; a branded semaphore cannot be indexed at all.
    value = sem[()]  # type: ignore[index]  # pyright: ignore[reportIndexIssue, reportUnknownVariableType]  # pyrefly: ignore[bad-index]  # ty: ignore[not-subscriptable]
    del value
    # A value where a REGULAR semaphore belongs.
    pl.semaphore_wait(pl.semaphore_read(flag))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
