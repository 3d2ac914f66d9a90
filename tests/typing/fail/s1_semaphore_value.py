"""S1: a semaphore *value* where a semaphore ref belongs (docs/catalogue.md).

``pl.semaphore_read(sem)`` and ``safedma.read(sem)`` return a ``jax.Array``
(the count), not the semaphore. Passed as a copy's semaphore, pltpu today
fails only at trace time ("DMA source semaphore must be a Ref."); safedma's
brands make it a type error. Each expected error is the ``# type: ignore[code]``
on its line; with --warn-unused-ignores a missing error fails the test.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl

import safedma
from safedma import DataRef, SemRef


def seed_send_sem_from_pl_read(
    x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef
) -> None:
    # S1 (the seed): the send (source) semaphore is the value pl.semaphore_read returned.
    sem_val = pl.semaphore_read(send_sem)  # pyright: ignore[reportUnknownMemberType]
    copy = safedma.RemoteCopy(x_ref, o_ref, recv_sem)
    copy.with_send_sem(sem_val).to(safedma.neighbour("x")).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def seed_send_sem_from_safedma_read(
    x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef
) -> None:
    # S1 (the seed): the same, through safedma.read.
    sem_val = safedma.read(send_sem)
    copy = safedma.RemoteCopy(x_ref, o_ref, recv_sem)
    copy.with_send_sem(sem_val).to(safedma.neighbour("x")).start().wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def recv_sem_is_a_value(
    x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef
) -> None:
    # S1: the destination (receive) semaphore is a value.
    value = safedma.read(recv_sem)
    safedma.RemoteCopy(x_ref, o_ref, value)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def local_sem_is_a_value(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    # S1: a local copy's semaphore is a value.
    safedma.LocalCopy(x_hbm, buf, pl.semaphore_read(sem))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    # S1: a jnp scalar where the semaphore belongs.
    safedma.LocalCopy(x_hbm, buf, jnp.zeros((), jnp.int32))  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType, reportUnknownMemberType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def indexed_sem(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    # S1: sem[()] reads a value; a safedma semaphore cannot be indexed at all.
    value = sem[()]  # type: ignore[index]  # pyright: ignore[reportIndexIssue, reportUnknownVariableType]  # pyrefly: ignore[bad-index]  # ty: ignore[not-subscriptable]
    del value
