"""Hand-written pltpu twin of safedma.kernels.all_reduce: same algorithm, same pallas_calls.

The composed form is the twin reduce-scatter followed by safedma's own
all_gather (its twin belongs to that kernel's tests), so comparing it checks
the composition: the same two pallas_calls with the same parameters.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.kernels.all_gather import all_gather
from tests.support.twins.all_gather import RECV_SLOTS, _received, _send
from tests.support.twins.reduce_scatter import (
    HBM,
    neighbour_barrier,
    neighbour_id,
    reduce_scatter,
    reduce_scatter_ring,
    reduce_scatter_scratch,
)


def all_gather_ring(o_hbm: Any, send_sem: Any, recv_sems: Any, capacity: Any, *, axis: str) -> None:
    n = jax.lax.axis_size(axis)
    m = o_hbm.shape[0] // n
    me = jax.lax.axis_index(axis)
    steps = n - 1
    right = neighbour_id(axis, 1)
    left = neighbour_id(axis, -1)

    def forward(step: Any, carry: None) -> None:
        chunk = o_hbm.at[pl.ds((me - step + n) % n * m, m)]
        _send(
            chunk,
            chunk,
            step,
            downstream=right,
            send_sem=send_sem,
            recv_sems=recv_sems,
            capacity=capacity,
        ).wait()
        _received(step, steps, upstream=left, capacity=capacity)
        return carry

    jax.lax.fori_loop(0, steps, forward, None)


def all_reduce_kernel(
    x_hbm: Any,
    o_hbm: Any,
    x_bufs: Any,
    recv_bufs: Any,
    send_bufs: Any,
    x_sems: Any,
    send_sems: Any,
    recv_sems: Any,
    capacity: Any,
    out_buf: Any,
    out_sem: Any,
    gather_send_sem: Any,
    gather_recv_sems: Any,
    gather_capacity: Any,
    *,
    axis: str,
) -> None:
    m = out_buf.shape[0]
    mine = o_hbm.at[pl.ds(jax.lax.axis_index(axis) * m, m)]

    def store(total: Any) -> None:
        out_buf[...] = total.astype(out_buf.dtype)
        copy = pltpu.make_async_copy(out_buf, mine, out_sem)
        copy.start()
        copy.wait()

    neighbour_barrier(axis)
    reduce_scatter_ring(
        x_hbm,
        x_bufs,
        recv_bufs,
        send_bufs,
        x_sems,
        send_sems,
        recv_sems,
        capacity,
        axis=axis,
        finish=store,
    )
    all_gather_ring(o_hbm, gather_send_sem, gather_recv_sems, gather_capacity, axis=axis)


def all_reduce(
    x: jax.Array, *, axis: str, fused: bool = True, collective_id: int = 0, interpret: Any = False
) -> jax.Array:
    if not fused:
        chunk = reduce_scatter(x, axis=axis, collective_id=collective_id, interpret=interpret)
        return all_gather(
            chunk, axis=axis, concat_axis=0, collective_id=collective_id, interpret=interpret
        )
    n = jax.lax.axis_size(axis)
    m, cols = x.shape[0] // n, x.shape[1]
    body = functools.update_wrapper(
        functools.partial(all_reduce_kernel, axis=axis), all_reduce_kernel
    )
    result: jax.Array = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[
            *reduce_scatter_scratch(m, cols, x.dtype),
            pltpu.VMEM((m, cols), x.dtype),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA((RECV_SLOTS,)),
            pltpu.SemaphoreType.REGULAR(()),
        ],
        compiler_params=pltpu.CompilerParams(collective_id=collective_id),
        interpret=interpret,
        name="all_reduce",
    )(x)
    return result
