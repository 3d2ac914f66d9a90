"""Pass: raw pltpu shapes of reduce-scatter and all-to-all kernels, with the stubs.

* a direct-write reduce-scatter: an all-device barrier through dict device ids of
  ``jnp.int32(i)``; per row a keyword ``make_async_remote_copy`` and ``make_async_copy`` of
  size 0 or 1 started and dropped; a slot drained by a self-copy of the counted rows;
* a bidirectional reduce-scatter matmul: copies described once, started under one
  ``pl.when`` after a capacity ``semaphore_wait`` and waited (``.wait()``) under another;
  ``semaphore_signal(..., inc=1, device_id=(n,), device_id_type=MESH)``;
  ``semaphore_read`` of DMA and REGULAR semaphores in a debug print (the author's
  ``pltpu.semaphore_*`` / ``pltpu.DeviceIdType`` spellings were deprecated in 0.10.2 and
  removed in 0.12; the stubs leave them out, docs/stubs.md);
* a ragged all-to-all future: copies on a 3-D semaphore array, the wait side chosen as a
  bound method (``copy.wait_send if send else copy.wait_recv``), and a keyword
  ``run_scoped`` used as a ``functools.partial`` decorator.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, RegularSem, SemArray, SemArray3, SemRef


def all_device_barrier() -> None:
    barrier_sem = pltpu.get_barrier_semaphore()
    for i in range(4):
        pl.semaphore_signal(
            barrier_sem, device_id={"x": jnp.int32(i)}, device_id_type=pl.DeviceIdType.MESH
        )
    pl.semaphore_wait(barrier_sem, 4)


def direct_write_row(
    staging: DataRef,
    out: DataRef,
    send_sems: SemArray,
    recv_sem: SemArray,
    local_sems: SemArray,
    stg: jax.Array,
    send: jax.Array,
    keep: jax.Array,
    dest: jax.Array,
) -> None:
    pltpu.make_async_remote_copy(
        src_ref=staging.at[stg, pl.ds(0, send), :, :],
        dst_ref=out.at[pl.ds(0, send), :, :],
        send_sem=send_sems.at[stg],
        recv_sem=recv_sem.at[0],
        device_id={"x": dest},
        device_id_type=pl.DeviceIdType.MESH,
    ).start()
    pltpu.make_async_copy(
        src_ref=staging.at[stg, pl.ds(0, keep), :, :],
        dst_ref=out.at[pl.ds(0, keep), :, :],
        sem=local_sems.at[stg],
    ).start()


def drain_slot(staging: DataRef, send_sems: SemArray, counts: DataRef, slot: int) -> None:
    sent = counts[slot]
    pltpu.make_async_copy(
        src_ref=staging.at[slot, pl.ds(0, sent), :, :],
        dst_ref=staging.at[slot, pl.ds(0, sent), :, :],
        sem=send_sems.at[slot],
    ).wait()


def capacity_step(
    hbm: DataRef, send: SemRef, recv: SemRef, capacity: RegularSem, phase: jax.Array
) -> None:
    me = jax.lax.axis_index("x")
    right = jax.lax.rem(me + 1, 4)
    copy = pltpu.make_async_remote_copy(
        src_ref=hbm.at[0],
        dst_ref=hbm.at[1],
        send_sem=send,
        recv_sem=recv,
        device_id=(right,),
        device_id_type=pl.DeviceIdType.MESH,
    )

    @pl.when(phase == 0)
    def _start() -> None:
        pl.semaphore_wait(capacity, 1)
        copy.start()

    @pl.when(phase == 0)
    def _epilogue() -> None:
        copy.wait()
        pl.semaphore_signal(
            capacity, inc=1, device_id=(right,), device_id_type=pl.DeviceIdType.MESH
        )
        pl.debug_print("recv={} capacity={}", pl.semaphore_read(recv), pl.semaphore_read(capacity))


def future_side(
    src: DataRef, dst: DataRef, sems: SemArray3, other: jax.Array, send: bool
) -> Callable[[], None]:
    direction = (other > 0).astype(jnp.int32)
    copy = pltpu.make_async_remote_copy(
        src, dst, sems.at[other, direction, 0], sems.at[other, direction, 1], device_id={"x": other}
    )
    wait_fn = copy.wait_send if send else copy.wait_recv
    return wait_fn


def future_second_barrier(others: list[jax.Array]) -> None:
    @functools.partial(pl.run_scoped, second_barrier=pltpu.SemaphoreType.REGULAR)
    def _final_barrier(second_barrier: RegularSem) -> None:
        for to in others:
            pl.semaphore_signal(second_barrier, inc=1, device_id={"x": to})
        pl.semaphore_wait(second_barrier, len(others))
