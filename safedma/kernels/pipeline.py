"""Double-buffered HBM pipeline: stream an array through VMEM, computing on each chunk.

``pipeline(x, fn, chunk_rows=c)`` returns ``fn`` applied to every ``c``-row
chunk of the 2-D HBM array ``x``, as ``jnp.concatenate([fn(chunk) ...])``
would, with the DMAs overlapped with the compute: while chunk ``i`` is
computed, chunk ``i + 1`` is already being fetched and the result of chunk
``i - 1`` is being written back. ``fn`` maps a ``(c, cols)`` array to one of
the same shape and dtype (elementwise or blockwise, anything Mosaic lowers)::

    y = pipeline(x, lambda chunk: chunk * 2 + 1, chunk_rows=256)

Preconditions (checked before tracing, as ``ValueError``):

* ``x`` is 2-D, float32, int32 (VMEM tile ``(8, 128)``) or bfloat16 (tile
  ``(16, 128)``); ``cols`` is a multiple of 128;
* ``chunk_rows`` is a positive multiple of the tile rows and divides ``rows``;
* ``fn`` maps a ``(chunk_rows, cols)`` chunk to the same shape and dtype.

Memory: ``x`` and the output stay in HBM (``pl.ANY``); VMEM holds four
chunks (two input and two output buffers), which must fit the scoped VMEM
limit of the chip (``compile_for_tpu`` reports an overflow).

Semaphores: two DMA semaphores for the input buffers (``in_sems.at[slot]``)
and two for the output buffers (``out_sems.at[slot]``); each signals one copy
at a time.

DMA flow, for step ``i`` in slot ``s = i % 2`` of ``steps = rows // c``::

    before the loop: start fetch(0) -> in_bufs[0]
    step i:  start fetch(i + 1) -> in_bufs[1 - s]   (if i + 1 < steps)
             wait  fetch(i)                          (started in step i - 1, or before the loop)
             wait  write-back(i - 2) from out_bufs[s] (if i >= 2; frees the buffer)
             out_bufs[s] = fn(in_bufs[s])
             start write-back(i) -> o_hbm chunk i    (waited in step i + 2)
    after the loop: wait the last two write-backs

Every wait is for a copy started in an earlier iteration, so it goes through
``LocalCopy(...).started_elsewhere()``; the kernel body returns with no copy
in flight.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeAlias

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.kernels._call import hbm_call
from safedma.kernels._preconditions import LANES, check_int, check_tile_dtype
from safedma.kernels._typed_jax import eval_shape, fori_loop

__all__ = ["ChunkFn", "pipeline", "pipeline_kernel"]

ChunkFn: TypeAlias = Callable[[jax.Array], jax.Array]
"""The per-chunk compute: a ``(chunk_rows, cols)`` array to one of the same shape and dtype."""


def pipeline_kernel(
    x_hbm: sd.DataRef,
    o_hbm: sd.DataRef,
    in_bufs: sd.DataRef,
    out_bufs: sd.DataRef,
    in_sems: sd.SemArray,
    out_sems: sd.SemArray,
    *,
    fn: ChunkFn,
) -> None:
    """The kernel body: ``o_hbm`` chunk i = ``fn(x_hbm`` chunk i``)``, double-buffered both ways.

    ``in_bufs`` and ``out_bufs`` are VMEM ``(2, chunk_rows, cols)``;
    ``in_sems`` and ``out_sems`` hold two DMA semaphores each. Bind ``fn``
    with ``functools.partial`` to pass it to a ``pallas_call``.
    """
    chunk_rows = in_bufs.shape[1]
    steps = x_hbm.shape[0] // chunk_rows

    def fetch(step: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
        rows = pl.ds(step * chunk_rows, chunk_rows)
        return sd.LocalCopy(x_hbm.at[rows], in_bufs.at[slot], in_sems.at[slot])

    def write_back(step: jax.Array | int, slot: jax.Array | int) -> sd.LocalCopy:
        rows = pl.ds(step * chunk_rows, chunk_rows)
        return sd.LocalCopy(out_bufs.at[slot], o_hbm.at[rows], out_sems.at[slot])

    fetch(0, 0).start()

    def step_body(step: jax.Array, carry: None) -> None:
        slot = step % 2

        @pl.when(step + 1 < steps)
        def _prefetch_next() -> None:
            fetch(step + 1, 1 - slot).start()

        chunk = fetch(step, slot).started_elsewhere().wait()  # in_bufs[slot], landed

        @pl.when(step >= 2)
        def _free_output_buffer() -> None:
            write_back(step - 2, slot).started_elsewhere().wait()

        out_bufs[slot] = fn(chunk[...])
        write_back(step, slot).start()
        return carry

    fori_loop(0, steps, step_body, None)

    # The loop leaves the write-backs of its last two steps (one if steps == 1) in flight.
    for step in range(max(steps - 2, 0), steps):
        write_back(step, step % 2).started_elsewhere().wait()


def _check(x: jax.Array, fn: ChunkFn, chunk_rows_arg: object) -> None:
    if x.ndim != 2:
        raise ValueError(f"pipeline streams a 2-D array (rows, cols); got shape {x.shape}")
    dtype, tile = check_tile_dtype(x.dtype, "pipeline")
    rows, cols = x.shape
    chunk_rows = check_int(chunk_rows_arg, "chunk_rows", "pipeline", minimum=1)
    if chunk_rows % tile:
        raise ValueError(
            f"chunk_rows={chunk_rows} must be a multiple of {tile}, the rows of a VMEM "
            f"tile for {dtype.name} ({tile}, {LANES})"
        )
    if rows % chunk_rows:
        raise ValueError(f"rows={rows} must be divisible by chunk_rows={chunk_rows}")
    if cols % LANES:
        raise ValueError(f"cols={cols} must be a multiple of {LANES}, the lanes of a VMEM tile")
    chunk = jax.ShapeDtypeStruct((chunk_rows, cols), dtype)
    out = eval_shape(fn, chunk)
    if not isinstance(out, jax.ShapeDtypeStruct) or (out.shape, out.dtype) != (
        chunk.shape,
        chunk.dtype,
    ):
        raise ValueError(
            f"fn must map a chunk {dtype.name}{list(chunk.shape)} to the same shape and "
            f"dtype; it returns {out}"
        )


def pipeline(
    x: jax.Array,
    fn: ChunkFn,
    *,
    chunk_rows: int,
    interpret: bool | pltpu.InterpretParams = False,
) -> jax.Array:
    """``fn`` applied to each ``chunk_rows``-row chunk of ``x``, DMAs overlapped with compute.

    Raises ``ValueError`` when a precondition of the module docstring fails.
    """
    _check(x, fn, chunk_rows)
    chunk = (chunk_rows, x.shape[1])
    call = hbm_call(
        pipeline_kernel,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[
            sd.vmem((2, *chunk), x.dtype),
            sd.vmem((2, *chunk), x.dtype),
            sd.dma_semaphores(2),
            sd.dma_semaphores(2),
        ],
        interpret=interpret,
        name="pipeline",
        fn=fn,
    )
    return call(x)
