"""Hand-written pltpu twin of safedma.kernels.ppermute: same algorithm, same pallas_call."""

from __future__ import annotations

from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tests.support.twins._ring import hbm_call, neighbour


def _meet(sem: Any, target: Any, source: Any) -> None:
    pl.semaphore_signal(sem, 1, device_id=target)
    pl.semaphore_signal(sem, 1, device_id=source)
    pl.semaphore_wait(sem, 2)


def ppermute_kernel(
    x_ref: Any,
    o_ref: Any,
    send_sem: Any,
    recv_sem: Any,
    second_round: Any,
    *,
    axis: str,
    shift: int,
    barrier: bool,
) -> None:
    n = jax.lax.axis_size(axis)
    if shift % n == 0:
        copy = pltpu.make_async_copy(x_ref, o_ref, recv_sem)
        copy.start()
        copy.wait()
        return
    target = neighbour(axis, shift)
    source = neighbour(axis, -shift)
    if barrier:
        _meet(pltpu.get_barrier_semaphore(), target, source)
        _meet(second_round, target, source)
    remote = pltpu.make_async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id=target)
    remote.start()
    remote.wait()


def ppermute(
    x: jax.Array,
    *,
    axis: str,
    shift: int = 1,
    collective_id: int | None = None,
    interpret: Any = False,
) -> jax.Array:
    barrier = shift % jax.lax.axis_size(axis) != 0 and collective_id is not None
    return hbm_call(
        ppermute_kernel,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.REGULAR(()),
        ],
        collective_id=collective_id if barrier else None,
        interpret=interpret,
        name="ppermute",
        axis=axis,
        shift=shift,
        barrier=barrier,
    )(x)
