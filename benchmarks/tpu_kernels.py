"""The TPU benchmark's own kernels, written with safedma (twins: tpu_kernels_pltpu.py).

Each moves float32 rows of 128 lanes (512 bytes a row) and repeats its copy
``repeats`` times inside one kernel, so that a timing on a TPU measures the
DMAs and not the cost of launching a program. Both local kernels keep at
most two copies in flight (double buffering), the pattern a real kernel
uses to keep a DMA engine busy.

* :func:`hbm_to_vmem`: HBM -> VMEM, ``size`` bytes read per repetition in
  chunks of at most :data:`MAX_CHUNK_BYTES` into two VMEM slots.
* :func:`vmem_to_hbm`: VMEM -> HBM, one VMEM chunk written over the ``size``
  bytes of the output per repetition.
* :func:`hbm_to_hbm`: one HBM -> HBM DMA of the whole input (no VMEM), the
  copy XLA's ``jnp.copy`` is compared with.
* :func:`remote_copy`: this device's block to the next device along ``x``,
  one copy (both sides waited) per repetition, each into its own block of
  the neighbour's output, after a neighbour barrier.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd

ROW_BYTES = 128 * 4
MAX_CHUNK_BYTES = 4 * 2**20
HBM = pl.BlockSpec(memory_space=pl.ANY)


def chunk_rows(size_bytes: int) -> int:
    """Rows per DMA for a transfer of ``size_bytes`` (a multiple of 4 KiB)."""
    if size_bytes % 4096 or size_bytes <= 0:
        raise ValueError(f"sizes are positive multiples of 4 KiB, got {size_bytes}")
    return min(size_bytes, MAX_CHUNK_BYTES) // ROW_BYTES


def hbm_to_vmem_kernel(
    x_hbm: sd.DataRef, o_hbm: sd.DataRef, bufs: sd.DataRef, sems: sd.SemArray, *, repeats: int
) -> None:
    """Copy ``k`` reads chunk ``k % n`` of x into slot ``k % 2``; o gets the last chunk."""
    rows = bufs.shape[1]
    n = x_hbm.shape[0] // rows
    total = n * repeats

    def fetch(k: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
        return sd.LocalCopy(x_hbm.at[pl.ds((k % n) * rows, rows)], bufs.at[slot], sems.at[slot])

    fetch(0, 0).start()

    def step(k: jax.Array, carry: None) -> None:
        slot = k % 2

        @pl.when(k + 1 < total)
        def _next() -> None:
            fetch(k + 1, 1 - slot).start()

        fetch(k, slot).started_elsewhere().wait()
        return carry

    jax.lax.fori_loop(0, total, step, None)
    sd.LocalCopy(bufs.at[(total - 1) % 2], o_hbm, sems.at[0]).start().wait()


def vmem_to_hbm_kernel(
    x_hbm: sd.DataRef, o_hbm: sd.DataRef, buf: sd.DataRef, sems: sd.SemArray, *, repeats: int
) -> None:
    """Load one chunk into VMEM, then write it over every chunk of o, ``repeats`` times."""
    rows = buf.shape[0]
    n = o_hbm.shape[0] // rows
    total = n * repeats
    sd.LocalCopy(x_hbm, buf, sems.at[0]).start().wait()

    def store(k: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
        return sd.LocalCopy(buf, o_hbm.at[pl.ds((k % n) * rows, rows)], sems.at[slot])

    if n == 1:  # one destination chunk: two writes in flight would race on it

        def one(k: jax.Array, carry: None) -> None:
            store(k, 0).start().wait()
            return carry

        jax.lax.fori_loop(0, total, one, None)
        return

    store(0, 0).start()

    def step(k: jax.Array, carry: None) -> None:
        slot = k % 2

        @pl.when(k + 1 < total)
        def _next() -> None:
            store(k + 1, 1 - slot).start()

        store(k, slot).started_elsewhere().wait()
        return carry

    jax.lax.fori_loop(0, total, step, None)


def hbm_to_hbm_kernel(x_hbm: sd.DataRef, o_hbm: sd.DataRef, sem: sd.SemRef) -> None:
    """One DMA from HBM to HBM, waited."""
    sd.LocalCopy(x_hbm, o_hbm, sem).start().wait()


def remote_copy_kernel(
    x_hbm: sd.DataRef,
    o_hbm: sd.DataRef,
    send_sem: sd.SemRef,
    recv_sem: sd.SemRef,
    *,
    repeats: int,
) -> None:
    """Barrier with both neighbours, then ``repeats`` times: x to the right, both sides waited.

    Copy ``k`` lands in block ``k`` of the right neighbour's output: each
    destination is written once, since nothing orders a write into a
    neighbour after that neighbour received the previous one.
    """
    barrier = sd.barrier_semaphore()
    sd.signal(barrier, device=sd.neighbour("x", -1))
    sd.signal(barrier, device=sd.neighbour("x", 1))
    sd.wait(barrier, 2)

    rows = x_hbm.shape[0]

    def step(k: jax.Array, carry: None) -> None:
        dst = o_hbm.at[pl.ds(k * rows, rows)]
        copy = sd.RemoteCopy(x_hbm, dst, recv_sem).with_send_sem(send_sem)
        copy.to(sd.neighbour("x", 1)).start().wait()
        return carry

    jax.lax.fori_loop(0, repeats, step, None)


def hbm_to_vmem(x: jax.Array, *, repeats: int = 1) -> jax.Array:
    """Read all of ``x`` (``(rows, 128)`` f32) into VMEM ``repeats`` times; returns its last chunk."""
    rows = chunk_rows(x.shape[0] * ROW_BYTES)
    body = functools.update_wrapper(
        functools.partial(hbm_to_vmem_kernel, repeats=repeats), hbm_to_vmem_kernel
    )
    return sd.pallas_call(
        body,
        jax.ShapeDtypeStruct((rows, 128), x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[sd.vmem((2, rows, 128), x.dtype), sd.dma_semaphores(2)],
        name="hbm_to_vmem",
    )(x)


def vmem_to_hbm(x: jax.Array, *, size_bytes: int, repeats: int = 1) -> jax.Array:
    """Write the chunk ``x`` from VMEM over a ``size_bytes`` output, ``repeats`` times."""
    rows = chunk_rows(size_bytes)
    body = functools.update_wrapper(
        functools.partial(vmem_to_hbm_kernel, repeats=repeats), vmem_to_hbm_kernel
    )
    return sd.pallas_call(
        body,
        jax.ShapeDtypeStruct((size_bytes // ROW_BYTES, 128), x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[sd.vmem((rows, 128), x.dtype), sd.dma_semaphores(2)],
        name="vmem_to_hbm",
    )(x[:rows])


def hbm_to_hbm(x: jax.Array) -> jax.Array:
    """A copy of ``x`` made by one DMA, HBM to HBM."""
    return sd.pallas_call(
        hbm_to_hbm_kernel,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[sd.dma_semaphore()],
        name="hbm_to_hbm",
    )(x)


def remote_copy(x: jax.Array, *, repeats: int = 1) -> jax.Array:
    """Per device, inside ``jax.shard_map`` over ``x``: the left neighbour's block, ``repeats`` times."""
    body = functools.update_wrapper(
        functools.partial(remote_copy_kernel, repeats=repeats), remote_copy_kernel
    )
    return sd.pallas_call(
        body,
        jax.ShapeDtypeStruct((repeats * x.shape[0], *x.shape[1:]), x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[sd.dma_semaphore(), sd.dma_semaphore()],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        name="remote_copy",
    )(x)


def rows_of(size_bytes: int) -> int:
    return size_bytes // ROW_BYTES


def example(size_bytes: int) -> jax.Array:
    """Distinct values per row, so a wrong chunk shows in the interpret-mode check."""
    rows = rows_of(size_bytes)
    return jnp.arange(rows * 128, dtype=jnp.float32).reshape(rows, 128)
