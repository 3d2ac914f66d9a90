"""S2: a semaphore array where one semaphore belongs (``.at[i]`` forgotten), and indexing one semaphore again."""

from __future__ import annotations

from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, RegularSemArray, SemArray, SemArray2, SemRef


def forgot_at(x_hbm: DataRef, buf: DataRef, sems: SemArray, flags: RegularSemArray) -> None:
    pltpu.make_async_copy(x_hbm, buf, sems).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.async_remote_copy(x_hbm, buf, sems, sems.at[1], device_id=0)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_copy(x_hbm, buf, sems.at[pl.ds(0, 2)]).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pl.semaphore_signal(flags)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pl.semaphore_wait(flags, 2)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def index_a_scalar(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    pltpu.make_async_copy(x_hbm, buf, sem.at[0]).start()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownArgumentType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]


def forgot_at_where_indices_are_untyped(
    x_hbm: DataRef, bufs: DataRef, sems: SemArray, sems2: SemArray2
) -> None:
    # A kernel's closures take their indices unannotated (Any): the array itself is still
    # not one semaphore.
    def fetch(step: Any, slot: Any) -> None:
        pltpu.make_async_copy(x_hbm.at[step], bufs.at[slot], sems2.at[slot, 0]).start()
        pltpu.make_async_copy(x_hbm.at[step], bufs.at[slot], sems).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
        pltpu.make_async_copy(x_hbm.at[step], bufs.at[slot], sems2).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]

    fetch(0, 0)


def partial_index_of_a_2d_array(x_hbm: DataRef, bufs: DataRef, sems2: SemArray2, slot: jax.Array) -> None:
    # One index of a 2-D array is a row of semaphores (an int or jax.Array index; an
    # untyped one makes the result Any in every checker: docs/stubs.md, Limits).
    pltpu.make_async_copy(x_hbm, bufs.at[slot], sems2.at[slot]).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_copy(x_hbm, bufs.at[slot], sems2.at[1]).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
