"""Hand-written pltpu twins of safedma.kernels.all_gather: same algorithms, same pallas_calls."""

from __future__ import annotations

from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tests.support.twins._ring import RECV_SLOTS, hbm_call, neighbour, received, send


def _window(ref: Any, windows: dict[int, Any]) -> Any:
    return ref.at[tuple(windows.get(d, slice(None)) for d in range(len(ref.shape)))]


def _neighbour_barrier(left: Any, right: Any) -> None:
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id=left)
    pl.semaphore_signal(barrier, 1, device_id=right)
    pl.semaphore_wait(barrier, 2)


def all_gather_kernel(
    x_ref: Any,
    o_ref: Any,
    local_sem: Any,
    send_sem: Any,
    recv_sems: Any,
    capacity: Any,
    *,
    axis: str,
    concat_axis: int,
    barrier: bool,
) -> None:
    n = jax.lax.axis_size(axis)
    me = jax.lax.axis_index(axis)
    size = x_ref.shape[concat_axis]

    def slot(owner: Any) -> Any:
        return _window(o_ref, {concat_axis: pl.ds(owner * size, size)})

    own = pltpu.make_async_copy(x_ref, slot(me), local_sem)
    own.start()
    if n > 1:
        steps = n - 1
        right = neighbour(axis, 1)
        left = neighbour(axis, -1)
        if barrier:
            _neighbour_barrier(left, right)
        ring = dict(downstream=right, send_sem=send_sem, recv_sems=recv_sems, capacity=capacity)

        send(x_ref, slot(me), 0, **ring).wait()
        received(0, steps, upstream=left, capacity=capacity)

        def body(step: Any, carry: None) -> None:
            owner = (me - step + n) % n
            send(slot(owner), slot(owner), step, **ring).wait()
            received(step, steps, upstream=left, capacity=capacity)
            return carry

        jax.lax.fori_loop(1, steps, body, None)
    own.wait()


def all_gather_bidirectional_kernel(
    x_ref: Any,
    o_ref: Any,
    local_sem: Any,
    send_sems: Any,
    recv_sems: Any,
    capacity: Any,
    *,
    axis: str,
    concat_axis: int,
    split_axis: int,
    barrier: bool,
) -> None:
    n = jax.lax.axis_size(axis)
    me = jax.lax.axis_index(axis)
    size = x_ref.shape[concat_axis]
    half = x_ref.shape[split_axis] // 2

    def part(which: int) -> dict[int, Any]:
        return {split_axis: pl.ds(which * half, half)}

    def piece(owner: Any, which: int) -> Any:
        if split_axis == concat_axis:
            return _window(o_ref, {concat_axis: pl.ds(owner * size + which * half, half)})
        return _window(o_ref, {concat_axis: pl.ds(owner * size, size), **part(which)})

    own = pltpu.make_async_copy(
        x_ref, _window(o_ref, {concat_axis: pl.ds(me * size, size)}), local_sem
    )
    own.start()
    if n > 1:
        steps = n - 1
        right, left = neighbour(axis, 1), neighbour(axis, -1)
        rightward = dict(
            downstream=right,
            send_sem=send_sems.at[0],
            recv_sems=recv_sems.at[pl.ds(0, RECV_SLOTS)],
            capacity=capacity.at[0],
        )
        leftward = dict(
            downstream=left,
            send_sem=send_sems.at[1],
            recv_sems=recv_sems.at[pl.ds(RECV_SLOTS, RECV_SLOTS)],
            capacity=capacity.at[1],
        )
        if barrier:
            _neighbour_barrier(left, right)

        def step(
            src_right: Any, src_left: Any, owner_right: Any, owner_left: Any, index: Any
        ) -> None:
            to_right = send(src_right, piece(owner_right, 0), index, **rightward)
            to_left = send(src_left, piece(owner_left, 1), index, **leftward)
            to_right.wait()
            to_left.wait()
            received(index, steps, upstream=left, capacity=rightward["capacity"])
            received(index, steps, upstream=right, capacity=leftward["capacity"])

        step(_window(x_ref, part(0)), _window(x_ref, part(1)), me, me, 0)

        def body(index: Any, carry: None) -> None:
            from_left = (me - index + n) % n
            from_right = (me + index) % n
            step(piece(from_left, 0), piece(from_right, 1), from_left, from_right, index)
            return carry

        jax.lax.fori_loop(1, steps, body, None)
    own.wait()


def _out_shape(x: jax.Array, axis: str, concat_axis: int) -> jax.ShapeDtypeStruct:
    shape = list(x.shape)
    shape[concat_axis] *= jax.lax.axis_size(axis)
    return jax.ShapeDtypeStruct(tuple(shape), x.dtype)


def all_gather(
    x: jax.Array,
    *,
    axis: str,
    concat_axis: int = 0,
    collective_id: int | None = None,
    interpret: Any = False,
) -> jax.Array:
    concat = concat_axis % x.ndim
    n = jax.lax.axis_size(axis)
    barrier = n > 1 and collective_id is not None
    return hbm_call(
        all_gather_kernel,
        _out_shape(x, axis, concat),
        scratch_shapes=[
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA((RECV_SLOTS,)),
            pltpu.SemaphoreType.REGULAR(()),
        ],
        collective_id=collective_id if barrier else None,
        interpret=interpret,
        name="all_gather",
        axis=axis,
        concat_axis=concat,
        barrier=barrier,
    )(x)


def all_gather_bidirectional(
    x: jax.Array,
    *,
    axis: str,
    concat_axis: int = 0,
    split_axis: int = 0,
    collective_id: int | None = None,
    interpret: Any = False,
) -> jax.Array:
    concat = concat_axis % x.ndim
    split = split_axis % x.ndim
    n = jax.lax.axis_size(axis)
    barrier = n > 1 and collective_id is not None
    return hbm_call(
        all_gather_bidirectional_kernel,
        _out_shape(x, axis, concat),
        scratch_shapes=[
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.DMA((2 * RECV_SLOTS,)),
            pltpu.SemaphoreType.REGULAR((2,)),
        ],
        collective_id=collective_id if barrier else None,
        interpret=interpret,
        name="all_gather_bidirectional",
        axis=axis,
        concat_axis=concat,
        split_axis=split,
        barrier=barrier,
    )(x)
