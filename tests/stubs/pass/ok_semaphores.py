"""Pass: REGULAR and BARRIER semaphores through pl.semaphore_* and pltpu, as raw code writes them."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from typing import assert_type

from safedma import BarrierSem, DataRef, RegularSem, RegularSemArray, SemRef


def local_handshake(flag: RegularSem, flags: RegularSemArray, o_ref: DataRef) -> None:
    pl.semaphore_signal(flag)
    pl.semaphore_signal(flag, 2)
    pl.semaphore_wait(flag, 3)
    pl.semaphore_signal(flags.at[1], inc=jnp.int32(1))
    pl.semaphore_wait(flags.at[1], decrement=False)
    count = pl.semaphore_read(flag)
    assert_type(count, jax.Array)
    o_ref[...] = jnp.broadcast_to(count.astype(jnp.float32), o_ref.shape)


def barrier_then_send(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    """The usual collective prologue: meet both neighbours at the barrier, then copy."""
    me = jax.lax.axis_index("x")
    barrier = pltpu.get_barrier_semaphore()
    assert_type(barrier, BarrierSem)
    pl.semaphore_signal(barrier, device_id={"x": (me + 1) % 4})
    pl.semaphore_signal(barrier, 1, device_id=((me + 3) % 4,), core_index=None)
    pl.semaphore_wait(barrier, 2)
    in_flight = pl.semaphore_read(send_sem)
    assert_type(in_flight, jax.Array)

    @pl.when(in_flight == 0)
    def _() -> None:
        pltpu.async_remote_copy(x_ref, o_ref, send_sem, recv_sem, device_id={"x": (me + 1) % 4}).wait()


def cores_meet(flag: RegularSem, barrier: BarrierSem) -> None:
    pltpu.core_barrier(flag, core_axis_name="core")
    pltpu.core_barrier(barrier, core_axis_name="core")
