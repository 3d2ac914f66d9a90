"""A realistic kernel file written with safedma (type-checking benchmark, side A).

Three kernels a TPU author writes: a double-buffered elementwise stream, a
paged gather with one aggregate wait, and a ring all-gather with remote
copies and a neighbour barrier; each with its pallas_call and shard_map set-up.
kernels_pltpu.py is the same file in raw pltpu.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import Mesh, PartitionSpec as P

import safedma as sd

CHUNK = 16
HBM = pl.BlockSpec(memory_space=pl.ANY)


def add_stream_kernel(
    a_hbm: sd.DataRef,
    b_hbm: sd.DataRef,
    o_hbm: sd.DataRef,
    a_bufs: sd.DataRef,
    b_bufs: sd.DataRef,
    o_buf: sd.DataRef,
    in_sems: sd.SemArray,
    out_sem: sd.SemRef,
) -> None:
    steps = a_hbm.shape[0] // CHUNK

    def fetch(
        src: sd.DataRef,
        bufs: sd.DataRef,
        step: jax.Array | int,
        slot: jax.Array | int,
        sem: sd.SemRef,
    ) -> sd.LocalCopy:
        return sd.LocalCopy(src.at[pl.ds(step * CHUNK, CHUNK)], bufs.at[slot], sem)

    fetch(a_hbm, a_bufs, 0, 0, in_sems.at[0]).start()
    fetch(b_hbm, b_bufs, 0, 0, in_sems.at[1]).start()

    def body(step: jax.Array, carry: None) -> None:
        slot = step % 2

        @pl.when(step + 1 < steps)
        def _prefetch() -> None:
            fetch(a_hbm, a_bufs, step + 1, 1 - slot, in_sems.at[0]).start()
            fetch(b_hbm, b_bufs, step + 1, 1 - slot, in_sems.at[1]).start()

        fetch(a_hbm, a_bufs, step, slot, in_sems.at[0]).started_elsewhere().wait()
        fetch(b_hbm, b_bufs, step, slot, in_sems.at[1]).started_elsewhere().wait()
        o_buf[...] = a_bufs[slot] + b_bufs[slot]
        sd.LocalCopy(o_buf, o_hbm.at[pl.ds(step * CHUNK, CHUNK)], out_sem).start().wait()
        return carry

    jax.lax.fori_loop(0, steps, body, None)


def add_stream(a: jax.Array, b: jax.Array) -> jax.Array:
    chunk = (CHUNK, a.shape[1])
    return sd.pallas_call(
        add_stream_kernel,
        jax.ShapeDtypeStruct(a.shape, a.dtype),
        in_specs=[HBM, HBM],
        out_specs=HBM,
        scratch_shapes=[
            sd.vmem((2, *chunk), a.dtype),
            sd.vmem((2, *chunk), a.dtype),
            sd.vmem(chunk, a.dtype),
            sd.dma_semaphores(2),
            sd.dma_semaphore(),
        ],
    )(a, b)


def gather_kernel(
    idx_smem: sd.DataRef, pages_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sem: sd.SemRef
) -> None:
    k = buf.shape[0]
    for j in range(k):
        sd.LocalCopy(pages_hbm.at[idx_smem[j]], buf.at[j], sem).start()
    sd.LocalCopy(buf, buf, sem).started_elsewhere().wait()  # one wait for all k pages
    sd.LocalCopy(buf, o_hbm, sem).start().wait()


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
    return sd.pallas_call(
        gather_kernel, jax.ShapeDtypeStruct((k, *pages.shape[1:]), pages.dtype), grid_spec=grid_spec
    )(idx, pages)


def all_gather_kernel(
    x_hbm: sd.DataRef,
    o_hbm: sd.DataRef,
    send_sems: sd.SemArray,
    recv_sems: sd.SemArray,
    *,
    axis: str,
) -> None:
    n = sd.axis_size(axis)
    me = sd.my_index(axis)
    rows = x_hbm.shape[0]
    barrier = sd.barrier_semaphore()
    sd.signal(barrier, device=sd.neighbour(axis, -1))
    sd.signal(barrier, device=sd.neighbour(axis, 1))
    sd.wait(barrier, 2)
    sd.LocalCopy(x_hbm, o_hbm.at[pl.ds(me * rows, rows)], send_sems.at[0]).start().wait()

    def step(s: jax.Array, carry: None) -> None:
        slot = s % 2
        block = (me - s + n) % n  # the block this device forwards at step s
        copy = (
            sd.RemoteCopy(
                o_hbm.at[pl.ds(block * rows, rows)],
                o_hbm.at[pl.ds(block * rows, rows)],
                recv_sems.at[slot],
            )
            .with_send_sem(send_sems.at[slot])
            .to(sd.neighbour(axis, 1))
        )
        copy.start().wait()
        return carry

    jax.lax.fori_loop(0, n - 1, step, None)


def all_gather(x: jax.Array, *, axis: str = "x") -> jax.Array:
    n = sd.axis_size(axis)
    body = functools.update_wrapper(
        functools.partial(all_gather_kernel, axis=axis), all_gather_kernel
    )
    return sd.pallas_call(
        body,
        jax.ShapeDtypeStruct((n * x.shape[0], *x.shape[1:]), x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[sd.dma_semaphores(2), sd.dma_semaphores(2)],
        compiler_params=pltpu.CompilerParams(collective_id=0),
    )(x)


def sharded_all_gather(mesh: Mesh, x: jax.Array) -> jax.Array:
    run = jax.shard_map(all_gather, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)
    result: jax.Array = jax.jit(run)(x)
    return result


def example(mesh: Mesh) -> jax.Array:
    x = jnp.ones((8 * mesh.shape["x"], 128), jnp.float32)
    pages = jnp.zeros((16, 8, 128), jnp.float32)
    idx = jnp.arange(4, dtype=jnp.int32)
    return add_stream(x, x).sum() + gather(pages, idx).sum() + sharded_all_gather(mesh, x).sum()
