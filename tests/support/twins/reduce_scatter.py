"""Hand-written pltpu twin of safedma.kernels.reduce_scatter: same algorithm, same pallas_call."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tests.support.twins._ring import hbm_call, neighbour

VMEM = pl.BlockSpec(memory_space=pltpu.VMEM)
neighbour_id = neighbour


def neighbour_barrier(axis: str) -> None:
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id=neighbour_id(axis, -1))
    pl.semaphore_signal(barrier, 1, device_id=neighbour_id(axis, 1))
    pl.semaphore_wait(barrier, 2)


def reduce_scatter_ring(x_hbm: Any, scratch: Sequence[Any], *, axis: str, finish: Any) -> None:
    """The ring; ``scratch`` is reduce_scatter_scratch's refs, in its order."""
    x_bufs, recv_bufs, send_bufs, x_sems, send_sems, recv_sems, capacity = scratch
    n = jax.lax.axis_size(axis)
    m = x_bufs.shape[1]
    me = jax.lax.axis_index(axis)

    def fetch(step: Any, slot: Any) -> Any:
        chunk = (me - step - 1 + n) % n
        return pltpu.make_async_copy(
            x_hbm.at[pl.ds(chunk * m, m)], x_bufs.at[slot], x_sems.at[slot]
        )

    def message(slot: Any) -> Any:
        return pltpu.make_async_remote_copy(
            send_bufs.at[slot],
            recv_bufs.at[slot],
            send_sems.at[slot],
            recv_sems.at[slot],
            device_id=neighbour_id(axis, 1),
        )

    left = neighbour_id(axis, -1)
    fetch(0, 0).start()
    fetch(1, 1).start()
    fetch(0, 0).wait()
    send_bufs[0] = x_bufs[0].astype(jnp.float32)
    message(0).start()

    def body(step: Any, carry: None) -> None:
        slot = step % 2
        prev = 1 - slot
        fetch(step, slot).wait()

        @pl.when(step + 1 < n)
        def _() -> None:
            fetch(step + 1, prev).start()

        message(prev).wait_recv()
        total = recv_bufs[prev] + x_bufs[slot].astype(jnp.float32)

        @pl.when(step - 1 + 2 < n - 1)
        def _() -> None:
            pl.semaphore_signal(capacity, 1, device_id=left)

        @pl.when(step + 1 < n)
        def _() -> None:
            @pl.when(step >= 2)
            def _() -> None:
                message(slot).wait_send()

            send_bufs[slot] = total

            @pl.when(step >= 2)
            def _() -> None:
                pl.semaphore_wait(capacity, 1)

            message(slot).start()

        @pl.when(step + 1 == n)
        def _() -> None:
            finish(total)

        return carry

    jax.lax.fori_loop(1, n, body, None)
    for sent in range(max(n - 3, 0), n - 1):
        message(sent % 2).wait_send()


def reduce_scatter_kernel(x_hbm: Any, o_ref: Any, *scratch: Any, axis: str) -> None:
    def store(total: Any) -> None:
        o_ref[...] = total.astype(o_ref.dtype)

    neighbour_barrier(axis)
    reduce_scatter_ring(x_hbm, scratch, axis=axis, finish=store)


def reduce_scatter_scratch(chunk_rows: int, cols: int, dtype: Any) -> list[Any]:
    chunk = (2, chunk_rows, cols)
    return [
        pltpu.VMEM(chunk, dtype),
        pltpu.VMEM(chunk, jnp.float32),
        pltpu.VMEM(chunk, jnp.float32),
        pltpu.SemaphoreType.DMA((2,)),
        pltpu.SemaphoreType.DMA((2,)),
        pltpu.SemaphoreType.DMA((2,)),
        pltpu.SemaphoreType.REGULAR(()),
    ]


def reduce_scatter(
    x: jax.Array, *, axis: str, collective_id: int = 0, interpret: Any = False
) -> jax.Array:
    n = jax.lax.axis_size(axis)
    m, cols = x.shape[0] // n, x.shape[1]
    return hbm_call(
        reduce_scatter_kernel,
        jax.ShapeDtypeStruct((m, cols), x.dtype),
        out_specs=VMEM,
        scratch_shapes=reduce_scatter_scratch(m, cols, x.dtype),
        collective_id=collective_id,
        interpret=interpret,
        name="reduce_scatter",
        axis=axis,
    )(x)
