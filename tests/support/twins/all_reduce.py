"""Hand-written pltpu twin of safedma.kernels.all_reduce: same algorithm, same pallas_calls.

The composed form is the twin reduce-scatter followed by safedma's own
all_gather (its twin belongs to that kernel's tests), so comparing it checks
the composition: the same two pallas_calls with the same parameters.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma.kernels.all_gather import all_gather
from tests.support.twins._ring import RECV_SLOTS, hbm_call, neighbour, received, send
from tests.support.twins.reduce_scatter import neighbour_barrier, reduce_scatter
from tests.support.twins.reduce_scatter import reduce_scatter_ring, reduce_scatter_scratch


def all_gather_ring(o_hbm: Any, send_sem: Any, recv_sems: Any, capacity: Any, *, axis: str) -> None:
    n = jax.lax.axis_size(axis)
    m = o_hbm.shape[0] // n
    me = jax.lax.axis_index(axis)
    steps = n - 1
    right = neighbour(axis, 1)
    left = neighbour(axis, -1)

    def forward(step: Any, carry: None) -> None:
        chunk = o_hbm.at[pl.ds((me - step + n) % n * m, m)]
        send(
            chunk,
            chunk,
            step,
            downstream=right,
            send_sem=send_sem,
            recv_sems=recv_sems,
            capacity=capacity,
        ).wait()
        received(step, steps, upstream=left, capacity=capacity)
        return carry

    jax.lax.fori_loop(0, steps, forward, None)


def all_reduce_kernel(x_hbm: Any, o_hbm: Any, *scratch: Any, axis: str) -> None:
    """``scratch``: the reduce-scatter's seven refs, then the output buffer and the gather's."""
    ring = scratch[:7]
    out_buf, out_sem, gather_send_sem, gather_recv_sems, gather_capacity = scratch[7:]
    m = out_buf.shape[0]
    mine = o_hbm.at[pl.ds(jax.lax.axis_index(axis) * m, m)]

    def store(total: Any) -> None:
        out_buf[...] = total.astype(out_buf.dtype)
        copy = pltpu.make_async_copy(out_buf, mine, out_sem)
        copy.start()
        copy.wait()

    neighbour_barrier(axis)
    reduce_scatter_ring(x_hbm, ring, axis=axis, finish=store)
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
    return hbm_call(
        all_reduce_kernel,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[
            *reduce_scatter_scratch(m, cols, x.dtype),
            pltpu.VMEM((m, cols), x.dtype),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA((RECV_SLOTS,)),
            pltpu.SemaphoreType.REGULAR(()),
        ],
        collective_id=collective_id,
        interpret=interpret,
        name="all_reduce",
        axis=axis,
    )(x)
