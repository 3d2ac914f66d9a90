"""One helper that either starts a copy or waits it (``wait: bool``), called in different
grid steps, the wait through ``started_elsewhere()``: local and remote copies, as
production kernels write their prefetches.

Each kernel lowers to the Mosaic of its raw pltpu spelling.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic

ANY = pl.BlockSpec(memory_space=pl.ANY)


# --- start-or-wait helpers across grid steps --------------------------------------------

STEPS = 4


def _start_or_wait(copy: sd.LocalCopy, wait: bool) -> None:
    if wait:
        copy.started_elsewhere().wait()
    else:
        copy.start()


def _start_or_wait_remote(copy: sd.RemoteCopy[sd.Given, sd.Given], wait: bool) -> None:
    if wait:
        copy.started_elsewhere().wait()
    else:
        copy.start()


def _steps(
    x_hbm: sd.DataRef,
    o_ref: sd.DataRef,
    landing: sd.DataRef,
    sem: sd.SemRef,
    send: sd.SemArray2,
    recv: sd.SemArray2,
    buf: sd.DataRef,
) -> None:
    step = pl.program_id(0)
    right = jax.lax.rem(sd.my_index("x") + 1, STEPS)
    half = x_hbm.shape[0] // 2

    def remote(side: int, wait: bool) -> None:
        rows = pl.ds(side * half, half)
        copy = (
            sd.RemoteCopy(x_hbm.at[rows], landing.at[step, rows], recv.at[side, step])
            .with_send_sem(send.at[side, step])
            .to(sd.mesh_coords(right))
        )
        _start_or_wait_remote(copy, wait)

    def local(wait: bool) -> None:
        _start_or_wait(sd.LocalCopy(landing.at[step - 1], buf.at[step % 2], sem), wait)

    @pl.when(step < STEPS - 1)
    def _() -> None:
        remote(0, False)
        remote(1, False)

    @pl.when(step > 0)
    def _() -> None:
        local(False)
        local(True)

    @pl.when(step < STEPS - 1)
    def _() -> None:
        remote(0, True)
        remote(1, True)

    o_ref[...] = buf[0]


def _steps_raw(
    x_hbm: Any, o_ref: Any, landing: Any, sem: Any, send: Any, recv: Any, buf: Any
) -> None:
    step = pl.program_id(0)
    right = jax.lax.rem(jax.lax.axis_index("x") + 1, STEPS)
    half = x_hbm.shape[0] // 2

    def op(copy: Any, wait: bool) -> None:
        copy.wait() if wait else copy.start()

    def remote(side: int, wait: bool) -> None:
        rows = pl.ds(side * half, half)
        op(
            pltpu.make_async_remote_copy(
                x_hbm.at[rows],
                landing.at[step, rows],
                send.at[side, step],
                recv.at[side, step],
                device_id=(right,),
                device_id_type=pl.DeviceIdType.MESH,
            ),
            wait,
        )

    @pl.when(step < STEPS - 1)
    def _() -> None:
        remote(0, False)
        remote(1, False)

    def local(wait: bool) -> None:
        op(pltpu.make_async_copy(landing.at[step - 1], buf.at[step % 2], sem), wait)

    @pl.when(step > 0)
    def _() -> None:
        local(False)
        local(True)

    @pl.when(step < STEPS - 1)
    def _() -> None:
        remote(0, True)
        remote(1, True)

    o_ref[...] = buf[0]


def _steps_call(body: Any, entry: Any) -> Any:
    def per_device(x: jax.Array) -> Any:
        m, k = x.shape
        return entry(
            body,
            (jax.ShapeDtypeStruct((m, k), x.dtype), jax.ShapeDtypeStruct((STEPS, m, k), x.dtype)),
            grid=(STEPS,),
            in_specs=[ANY],
            out_specs=(pl.BlockSpec(memory_space=pltpu.VMEM), ANY),
            scratch_shapes=[
                sd.dma_semaphore(),
                sd.dma_semaphores((2, STEPS)),
                sd.dma_semaphores((2, STEPS)),
                sd.vmem((2, m, k), x.dtype),
            ],
        )(x)[0]

    return per_device


def test_start_or_wait_helpers_across_grid_steps_match_raw() -> None:
    mesh = abstract_mesh((STEPS,), ("x",))
    x = jax.ShapeDtypeStruct((STEPS * 16, 128), jnp.float32, sharding=NamedSharding(mesh, P("x")))

    def wrap(fn: Any) -> Any:
        return jax.jit(
            jax.shard_map(fn, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
        )

    ours = wrap(_steps_call(_steps, sd.pallas_call))
    theirs = wrap(_steps_call(_steps_raw, pl.pallas_call))
    assert_same_mosaic(ours, theirs, x, mesh=mesh)
