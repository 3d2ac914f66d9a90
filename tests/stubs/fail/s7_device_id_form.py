"""S7: a device id of the wrong form: float, str, list, float coordinates."""

from __future__ import annotations

from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemRef


def wrong_forms(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=1.0).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id="x").start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=[0, 1]).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=(0.5, 1)).start()  # type: ignore[arg-type]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-argument-type]  # ty: ignore[invalid-argument-type]
    pltpu.async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id={"x": 1.5})  # type: ignore[dict-item]  # pyright: ignore[reportArgumentType]  # pyrefly: ignore[bad-assignment]  # ty: ignore[invalid-argument-type]
