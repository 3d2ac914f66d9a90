"""Kernels written with safedma for the hardest patterns of the census
(docs/reference PATTERNS.md), each with a raw pltpu twin in
``tests.support.twins.census`` and a pallas_call set-up shared by both.

* :func:`moe_all_to_all`: every device sends one block to every other device and
  copies its own block locally, all on ONE DMA semaphore, then waits by total
  size (fused MoE in vLLM and tokamax).
* :func:`rpa_prefetch`: a grid-step prefetch of pages into a double buffer with
  a 2-D semaphore array ``sems.at[slot, page]`` and the result copied out through
  a ``reshape`` + ``bitcast`` view (ragged paged attention).
* :func:`future_start` / :func:`future_done`: a copy started by one pallas_call
  and waited by another (jax's TPU async tests, vLLM KV transfer).
* :func:`pipelined_scale`: an ``emit_pipeline`` body inside a checked kernel,
  next to safedma copies (``sync_copy``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import AbstractMesh, Mesh, PartitionSpec as P

import safedma as sd
from safedma import DataRef, SemArray2, SemRef

HBM = pl.BlockSpec(memory_space=pl.ANY)
AXIS = "x"
PAGES = 4  # pages per step
PAGE_ROWS = 8
LANES = 128


# --- MoE-style all-to-all: one semaphore, waited by total size -----------------


def _moe_start(x_ref: DataRef, o_ref: DataRef, sem: SemRef) -> None:
    n = sd.axis_size(AXIS)
    me = sd.my_index(AXIS)
    rows = x_ref.shape[0] // n
    mine = o_ref.at[pl.ds(me * rows, rows)]
    sd.LocalCopy(x_ref.at[pl.ds(me * rows, rows)], mine, sem).start()
    for shift in range(1, n):
        peer = (me + shift) % n
        copy = sd.RemoteCopy(x_ref.at[pl.ds(peer * rows, rows)], mine, sem)
        copy.with_send_sem(sem).to(sd.device({AXIS: peer})).start()


def moe_all_to_all(x_ref: DataRef, o_ref: DataRef, sem: SemRef) -> None:
    _moe_start(x_ref, o_ref, sem)
    # The semaphore counted the local block and n - 1 received blocks (o_ref's
    # size) and n - 1 sent blocks: two waits by size.
    n = sd.axis_size(AXIS)
    sd.wait_bytes(sem, o_ref)
    sd.wait_bytes(sem, o_ref.at[pl.ds(0, (n - 1) * (o_ref.shape[0] // n))])


def moe_then_read(
    block: Callable[[jax.Array, int], jax.Array], early: bool
) -> Callable[[DataRef, DataRef, DataRef, SemRef, SemRef], None]:
    """The all-to-all, then block ``block(me, n)`` of the result copied into VMEM:
    after both waits (correct) or between them (``early``: a seeded bug, the first
    wait is satisfied by any n blocks of the 2n - 1 the semaphore counts)."""

    def kernel(x_ref: DataRef, o_ref: DataRef, buf: DataRef, sem: SemRef, copy_sem: SemRef) -> None:
        n = sd.axis_size(AXIS)
        me = sd.my_index(AXIS)
        rows = o_ref.shape[0] // n
        _moe_start(x_ref, o_ref, sem)
        sd.wait_bytes(sem, o_ref)

        def read() -> None:
            start = block(me, n) * rows
            sd.LocalCopy(o_ref.at[pl.ds(start, rows)], buf, copy_sem).start().wait()

        if early:
            read()  # census: moe_early
        sd.wait_bytes(sem, o_ref.at[pl.ds(0, (n - 1) * rows)])
        if not early:
            read()

    return kernel


def moe_one_block_short(x_ref: DataRef, o_ref: DataRef, sem: SemRef) -> None:
    """Seeded bug: the second wait is one block short (a sent block is never waited)."""
    _moe_start(x_ref, o_ref, sem)
    n = sd.axis_size(AXIS)
    sd.wait_bytes(sem, o_ref)
    sd.wait_bytes(sem, o_ref.at[pl.ds(0, (n - 2) * (o_ref.shape[0] // n))])


def moe_read_scratch(rows: int) -> list[Any]:
    return [sd.vmem((rows, LANES), jnp.float32), sd.dma_semaphore(), sd.dma_semaphore()]


def moe_call(
    kernel: Callable[..., None],
    mesh: Mesh | AbstractMesh,
    pallas: Callable[..., Any] = pl.pallas_call,
    scratch: list[Any] | None = None,
) -> Callable[[jax.Array], jax.Array]:
    def per_device(x: jax.Array) -> jax.Array:
        result: jax.Array = pallas(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=[pltpu.SemaphoreType.DMA(())] if scratch is None else scratch,
        )(x)
        return result

    mapped: Callable[[jax.Array], jax.Array] = jax.shard_map(
        per_device, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS), check_vma=False
    )
    return mapped


# --- ragged-paged-attention-style prefetch: 2-D semaphores and views ----------


def rpa_prefetch(
    table_smem: DataRef,
    pages_hbm: DataRef,
    o_hbm: DataRef,
    buf: DataRef,
    sems: SemArray2,
    out_sem: SemRef,
) -> None:
    step = pl.program_id(0)
    steps = pl.num_programs(0)

    def fetch(s: jax.Array | int, slot: jax.Array | int) -> None:
        for p in range(PAGES):
            page = table_smem[s * PAGES + p]
            sd.LocalCopy(pages_hbm.at[page], buf.at[slot, p], sems.at[slot, p]).start()

    @pl.when(step == 0)
    def _() -> None:
        fetch(0, 0)

    @pl.when(step + 1 < steps)
    def _() -> None:
        fetch(step + 1, (step + 1) % 2)

    slot = step % 2
    for p in range(PAGES):
        # Started in the previous step (or above, for step 0).
        sd.LocalCopy(pages_hbm.at[0], buf.at[slot, p], sems.at[slot, p]).started_elsewhere().wait()
    flat = buf.reshape(2, PAGES * PAGE_ROWS, LANES).at[slot].bitcast(jnp.uint32)
    sd.LocalCopy(flat, o_hbm.at[step], out_sem).start().wait()


def rpa_call(
    kernel: Callable[..., None],
    steps: int,
    num_pages: int,
    pallas: Callable[..., Any] = pl.pallas_call,
    scratch: list[Any] | None = None,
) -> Callable[[jax.Array, jax.Array], jax.Array]:
    if scratch is None:
        scratch = [
            pltpu.VMEM((2, PAGES, PAGE_ROWS, LANES), jnp.float32),
            pltpu.SemaphoreType.DMA((2, PAGES)),
            pltpu.SemaphoreType.DMA(()),
        ]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(steps,),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=scratch,
    )
    del num_pages

    def run(table: jax.Array, pages: jax.Array) -> jax.Array:
        out = jax.ShapeDtypeStruct((steps, PAGES * PAGE_ROWS, LANES), jnp.uint32)
        result: jax.Array = pallas(kernel, out_shape=out, grid_spec=grid_spec)(table, pages)
        return result

    return run


def rpa_scratch() -> list[Any]:
    return [
        sd.vmem((2, PAGES, PAGE_ROWS, LANES), jnp.float32),
        sd.dma_semaphores((2, PAGES)),
        sd.dma_semaphore(),
    ]


# --- DMA future: started by one pallas_call, waited by another -----------------


def future_start(x_ref: DataRef, o_ref: DataRef, sem: SemRef) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).start()


def future_done(x_ref: DataRef, o_ref: DataRef, sem: SemRef) -> None:
    sd.LocalCopy(x_ref, o_ref, sem).started_elsewhere().wait()


@sd.checked_futures
def copy_through_future(x: jax.Array) -> jax.Array:
    future = sd.start_async(future_start, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
    y = x * 2  # work overlapped with the copy
    del y
    return sd.finish_async(future_done, future)


def future_step(future: sd.DmaFuture) -> sd.DmaFuture:
    """Finish one future and start the next from its result (a staggered chain)."""
    y = sd.finish_async(future_done, future)
    return sd.start_async(future_start, y, dst=jax.ShapeDtypeStruct(y.shape, y.dtype))


@sd.checked_futures
def staggered_futures(x: jax.Array) -> jax.Array:
    future = sd.start_async(future_start, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
    for _ in range(3):
        future = future_step(future)
    return sd.finish_async(future_done, future)


# --- emit_pipeline inside a checked kernel -------------------------------------

BLOCK = (8, LANES)


def _double(x_vmem: DataRef, o_vmem: DataRef) -> None:
    o_vmem[...] = x_vmem[...] * 2


def _block_index(i: jax.Array) -> tuple[jax.Array, int]:
    return i, 0


def pipelined_scale(x_hbm: DataRef, o_hbm: DataRef, buf: DataRef) -> None:
    spec = pl.BlockSpec(BLOCK, _block_index)
    steps = x_hbm.shape[0] // BLOCK[0]
    sd.emit_pipeline(_double, grid=(steps,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)
    # A safedma copy next to the pipeline: the first block again, through VMEM.
    sd.sync_copy(o_hbm.at[pl.ds(0, BLOCK[0])], buf)
    sd.sync_copy(buf, o_hbm.at[pl.ds(0, BLOCK[0])])


def pipeline_call(
    kernel: Callable[..., None], scratch: list[Any], pallas: Callable[..., Any] = pl.pallas_call
) -> Callable[[jax.Array], jax.Array]:
    def run(x: jax.Array) -> jax.Array:
        result: jax.Array = pallas(
            kernel,
            out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
            in_specs=[HBM],
            out_specs=HBM,
            scratch_shapes=scratch,
        )(x)
        return result

    return run
