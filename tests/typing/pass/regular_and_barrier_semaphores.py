"""Pass: REGULAR semaphore signal/wait (local and remote), safedma.read, and the
barrier semaphore handshake before a remote copy. Must pass ``mypy --strict`` and pyright strict.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from typing import assert_type

import safedma
from safedma import BarrierSem, DataRef, RegularSem, RegularSemArray, SemRef

from _typed_jax import array, eval_shape


def local_handshake(flag: RegularSem, flags: RegularSemArray, o_ref: DataRef) -> None:
    safedma.signal(flag)
    safedma.signal(flag, 2)
    safedma.wait(flag, 3)

    one = flags.at[1]
    assert_type(one, RegularSem)
    assert_type(flags.at[pl.ds(0, 2)], RegularSemArray)
    safedma.signal(one, inc=array(1, jnp.int32))
    safedma.wait(one)

    count = safedma.read(flag)
    assert_type(count, jax.Array)
    o_ref[...] = jnp.broadcast_to(count.astype(jnp.float32), o_ref.shape)


def remote_handshake(ready: RegularSem, x_ref: DataRef, o_ref: DataRef) -> None:
    """Tell the left neighbour we are ready; wait for the right neighbour's signal."""
    left = safedma.neighbour("x", -1)
    safedma.signal(ready, device=left)
    safedma.wait(ready)
    # The same handshake with the increment spelled out and the other neighbour.
    safedma.signal(ready, 1, device=safedma.neighbour("x"))
    safedma.wait(ready, 1)
    o_ref[...] = x_ref[...]


def meet_neighbours(barrier: BarrierSem) -> None:
    """Signal both ring neighbours' barrier semaphores and wait for theirs."""
    safedma.signal(barrier, device=safedma.neighbour("x"))
    safedma.signal(barrier, device=safedma.neighbour("x", -1))
    safedma.wait(barrier, 2)


def barrier_then_send(x_ref: DataRef, o_ref: DataRef, send_sem: SemRef, recv_sem: SemRef) -> None:
    """The usual collective prologue: meet both neighbours at the barrier, then copy."""
    barrier = safedma.barrier_semaphore()
    assert_type(barrier, BarrierSem)
    meet_neighbours(barrier)
    right = safedma.neighbour("x")

    in_flight = safedma.read(send_sem)
    assert_type(in_flight, jax.Array)

    handle = safedma.RemoteCopy(x_ref, o_ref, recv_sem).with_send_sem(send_sem).to(right).start()
    handle.wait()


def with_collective_id(x: jax.Array) -> jax.Array:
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    out_shape = eval_shape(lambda a: a, x)
    call = safedma.pallas_call(
        barrier_then_send,
        out_shape,
        in_specs=[any_spec],
        out_specs=any_spec,
        scratch_shapes=[safedma.dma_semaphore(), safedma.dma_semaphore()],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=pltpu.InterpretParams(),
    )
    return call(x)
