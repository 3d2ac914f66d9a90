"""A realistic kernel file written in raw pltpu (type-checking benchmark, side B).

kernels_safedma.py with every safedma call replaced by the pltpu calls it
lowers to, and kernel parameters annotated as pltpu code usually is (Any).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, PartitionSpec as P


CHUNK = 16
HBM = pl.BlockSpec(memory_space=pl.ANY)


def add_stream_kernel(
    a_hbm: Any,
    b_hbm: Any,
    o_hbm: Any,
    a_bufs: Any,
    b_bufs: Any,
    o_buf: Any,
    in_sems: Any,
    out_sem: Any,
) -> None:
    steps = a_hbm.shape[0] // CHUNK

    def fetch(src: Any, bufs: Any, step: jax.Array | int, slot: jax.Array | int, sem: Any) -> Any:
        return pltpu.make_async_copy(src.at[pl.ds(step * CHUNK, CHUNK)], bufs.at[slot], sem)

    fetch(a_hbm, a_bufs, 0, 0, in_sems.at[0]).start()
    fetch(b_hbm, b_bufs, 0, 0, in_sems.at[1]).start()

    def body(step: jax.Array, carry: None) -> None:
        slot = step % 2

        @pl.when(step + 1 < steps)
        def _prefetch() -> None:
            fetch(a_hbm, a_bufs, step + 1, 1 - slot, in_sems.at[0]).start()
            fetch(b_hbm, b_bufs, step + 1, 1 - slot, in_sems.at[1]).start()

        fetch(a_hbm, a_bufs, step, slot, in_sems.at[0]).wait()
        fetch(b_hbm, b_bufs, step, slot, in_sems.at[1]).wait()
        o_buf[...] = a_bufs[slot] + b_bufs[slot]
        out = pltpu.make_async_copy(o_buf, o_hbm.at[pl.ds(step * CHUNK, CHUNK)], out_sem)
        out.start()
        out.wait()
        return carry

    jax.lax.fori_loop(0, steps, body, None)


def add_stream(a: jax.Array, b: jax.Array) -> jax.Array:
    chunk = (CHUNK, a.shape[1])
    result: jax.Array = pl.pallas_call(
        add_stream_kernel,
        out_shape=jax.ShapeDtypeStruct(a.shape, a.dtype),
        in_specs=[HBM, HBM],
        out_specs=HBM,
        scratch_shapes=[
            pltpu.VMEM((2, *chunk), a.dtype),
            pltpu.VMEM((2, *chunk), a.dtype),
            pltpu.VMEM(chunk, a.dtype),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.DMA(()),
        ],
    )(a, b)
    return result


def gather_kernel(idx_smem: Any, pages_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    k = buf.shape[0]
    for j in range(k):
        pltpu.make_async_copy(pages_hbm.at[idx_smem[j]], buf.at[j], sem).start()
    pltpu.make_async_copy(buf, buf, sem).wait()  # one wait for all k pages
    out = pltpu.make_async_copy(buf, o_hbm, sem)
    out.start()
    out.wait()


def gather(pages: jax.Array, idx: jax.Array) -> jax.Array:
    k = idx.shape[0]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[
            pltpu.VMEM((k, *pages.shape[1:]), pages.dtype),
            pltpu.SemaphoreType.DMA(()),
        ],
    )
    result: jax.Array = pl.pallas_call(
        gather_kernel,
        out_shape=jax.ShapeDtypeStruct((k, *pages.shape[1:]), pages.dtype),
        grid_spec=grid_spec,
    )(idx, pages)
    return result


def all_gather_kernel(x_hbm: Any, o_hbm: Any, send_sems: Any, recv_sems: Any, *, axis: str) -> None:
    n = jax.lax.axis_size(axis)
    me = jax.lax.axis_index(axis)
    rows = x_hbm.shape[0]
    barrier = pltpu.get_barrier_semaphore()
    pl.semaphore_signal(barrier, 1, device_id={axis: (jax.lax.axis_index(axis) + (n - 1)) % n})
    pl.semaphore_signal(barrier, 1, device_id={axis: (jax.lax.axis_index(axis) + 1) % n})
    pl.semaphore_wait(barrier, 2)
    local = pltpu.make_async_copy(x_hbm, o_hbm.at[pl.ds(me * rows, rows)], send_sems.at[0])
    local.start()
    local.wait()

    def step(s: jax.Array, carry: None) -> None:
        slot = s % 2
        block = (me - s + n) % n  # the block this device forwards at step s
        copy = pltpu.make_async_remote_copy(
            o_hbm.at[pl.ds(block * rows, rows)],
            o_hbm.at[pl.ds(block * rows, rows)],
            send_sems.at[slot],
            recv_sems.at[slot],
            device_id={axis: (jax.lax.axis_index(axis) + 1) % n},
        )
        copy.start()
        copy.wait_send()
        copy.wait_recv()
        return carry

    jax.lax.fori_loop(0, n - 1, step, None)


def all_gather(x: jax.Array, *, axis: str = "x") -> jax.Array:
    n = jax.lax.axis_size(axis)
    body = functools.update_wrapper(
        functools.partial(all_gather_kernel, axis=axis), all_gather_kernel
    )
    result: jax.Array = pl.pallas_call(
        body,
        out_shape=jax.ShapeDtypeStruct((n * x.shape[0], *x.shape[1:]), x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.DMA((2,)), pltpu.SemaphoreType.DMA((2,))],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)
    return result


def sharded_all_gather(mesh: Mesh, x: jax.Array) -> jax.Array:
    run = jax.shard_map(all_gather, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    result: jax.Array = jax.jit(run)(x)
    return result


def example(mesh: Mesh) -> jax.Array:
    x = jnp.ones((8 * mesh.shape["x"], 128), jnp.float32)
    pages = jnp.zeros((16, 8, 128), jnp.float32)
    idx = jnp.arange(4, dtype=jnp.int32)
    return add_stream(x, x).sum() + gather(pages, idx).sum() + sharded_all_gather(mesh, x).sum()
