"""S2: a semaphore array where one semaphore belongs (``.at[i]`` forgotten), and indexing one semaphore again."""

from __future__ import annotations

from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, RegularSemArray, SemArray, SemRef


def forgot_at(x_hbm: DataRef, buf: DataRef, sems: SemArray, flags: RegularSemArray) -> None:
    pltpu.make_async_copy(x_hbm, buf, sems).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.async_remote_copy(x_hbm, buf, sems, sems.at[1], device_id=0)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_copy(x_hbm, buf, sems.at[pl.ds(0, 2)]).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pl.semaphore_signal(flags)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pl.semaphore_wait(flags, 2)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]


def index_a_scalar(x_hbm: DataRef, buf: DataRef, sem: SemRef) -> None:
    pltpu.make_async_copy(x_hbm, buf, sem.at[0]).start()  # type: ignore[attr-defined]  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType, reportUnknownArgumentType]  # pyrefly: ignore[missing-attribute]  # ty: ignore[missing-attribute]
