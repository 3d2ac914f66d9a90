"""Plugin corpus (S1, the seed): a jax.Array -- a semaphore's or a ref's value --
where a semaphore or a data ref belongs. mypy's own [arg-type] stays; the
plugin's sentence follows it. Expectations: ``# expect[code]: message`` above the line.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl

import safedma
from safedma import DataRef, RegularSem, SemRef


def seed(x: DataRef, o: DataRef, send: SemRef, recv: SemRef) -> None:
    sem_val = pl.semaphore_read(send)  # pyright: ignore[reportUnknownMemberType]
    copy = safedma.RemoteCopy(x, o, recv)
    # expect[arg-type]
    # expect[safedma-value-for-ref]: Argument "send_sem" to "with_send_sem" of "RemoteCopy" is a semaphore's value (a jax.Array, as pl.semaphore_read or safedma.read return) where the semaphore belongs: pass the SemRef itself
    copy.with_send_sem(sem_val).to(safedma.neighbour("x")).start().wait()  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def values_as_semaphores(x: DataRef, o: DataRef, sem: SemRef, flag: RegularSem) -> None:
    # expect[arg-type]
    # expect[safedma-value-for-ref]: Argument "recv_sem" to "RemoteCopy" is a semaphore's value (a jax.Array, as pl.semaphore_read or safedma.read return) where the semaphore belongs: pass the SemRef itself
    safedma.RemoteCopy(x, o, safedma.read(sem))  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # expect[arg-type]
    # expect[safedma-value-for-ref]: Argument "sem" to "LocalCopy" is a semaphore's value (a jax.Array, as pl.semaphore_read or safedma.read return) where the semaphore belongs: pass the SemRef itself
    safedma.LocalCopy(x, o, jnp.zeros((), jnp.int32))  # pyright: ignore[reportArgumentType, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    count = safedma.read(flag)
    # expect[arg-type]
    # expect[safedma-value-for-ref]: Argument "sem" to "signal" is a semaphore's value (a jax.Array, as pl.semaphore_read or safedma.read return) where the semaphore belongs: pass the RegularSem or BarrierSem itself
    safedma.signal(count)  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # expect[arg-type]
    # expect[safedma-value-for-ref]: Argument "sem" to "wait" is a semaphore's value (a jax.Array, as pl.semaphore_read or safedma.read return) where the semaphore belongs: pass the RegularSem or BarrierSem itself
    safedma.wait(count, 1)  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # The count itself is fine where a count belongs.
    safedma.signal(flag, count)


def values_as_data_refs(x: DataRef, o: DataRef, sem: SemRef) -> None:
    # expect[arg-type]
    # expect[safedma-value-for-ref]: Argument "src" to "LocalCopy" is an array value (a jax.Array, as x[...] reads) where a data ref belongs: pass the ref, or a view of it with x.at[...]
    safedma.LocalCopy(x[...], o, sem)  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # Other wrong types keep mypy's message only.
    # expect[arg-type]
    safedma.LocalCopy(x, o, o)  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
