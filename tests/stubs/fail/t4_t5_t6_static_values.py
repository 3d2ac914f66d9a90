"""T4, T5, T6 where the stubs catch them statically: priority, ``add=True``, a copy without a semaphore."""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemRef


def bad_values(x_ref: DataRef, o_ref: DataRef, sem: SemRef, recv_sem: SemRef) -> None:
    pltpu.make_async_copy(x_ref, o_ref, sem).start(priority=2)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_remote_copy(x_ref, o_ref, sem, recv_sem, device_id=1).start(priority=1)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_copy(x_ref, o_ref, sem).start(add=True)  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.async_copy(x_ref, o_ref, sem, add=True).wait()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_copy(x_ref, o_ref)  # type: ignore[call-arg]  # pyright: ignore[reportCallIssue]  # pyrefly: ignore[missing-argument]  # ty: ignore[missing-argument]
