"""Pass: raw pltpu shapes of KV-transfer, host-copy, SparseCore and pipeline kernels, with
the stubs.

* a chunked DMA future (a KV-cache transfer): copies of a length read from SMEM started in
  a ``pl.loop`` on an output semaphore, and rebuilt and waited in the next kernel;
* a copy to pinned host memory: ``pltpu.async_copy(...).wait()`` on a semaphore scoped by
  ``pl.run_scoped(body, pltpu.SemaphoreType.DMA)`` (the semaphore type itself, not an
  instance, as jax also takes);
* a SparseCore histogram: descriptors kept (or ``None``) and waited, a zero fill started in
  one ``pl.when`` and waited rebuilt in another; the semaphore type itself in a scratch
  list;
* a state cache double-buffered across ``emit_pipeline`` steps: rows started per token
  under ``pl.when`` and waited by a self-copy of the traced number of rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from safedma import DataRef, SemArray, SemRef


def chunks_start(
    num: DataRef, offsets: DataRef, sizes: DataRef, src: DataRef, dst: DataRef, sem: SemRef
) -> None:
    @pl.loop(0, num[0])
    def _(i: jax.Array) -> None:
        n = sizes[i]
        pltpu.make_async_copy(
            src.at[pl.ds(offsets[i], n)], dst.at[pl.ds(offsets[i], n)], sem
        ).start()


def chunks_done(
    num: DataRef, offsets: DataRef, sizes: DataRef, src: DataRef, dst: DataRef, sem: SemRef
) -> None:
    @pl.loop(0, num[0])
    def _(i: jax.Array) -> None:
        n = sizes[i]
        pltpu.make_async_copy(
            src.at[pl.ds(offsets[i], n)], dst.at[pl.ds(offsets[i], n)], sem
        ).wait()


def to_host(src: DataRef, host_in: DataRef, host_out: DataRef) -> None:
    del host_in

    def body(sem: SemRef) -> None:
        pltpu.async_copy(src, host_out, sem).wait()

    pl.run_scoped(body, pltpu.SemaphoreType.DMA)


def rows_in_and_waited(
    state: DataRef, bufs: DataRef, idx: DataRef, sems: SemArray, slot: jax.Array, n: jax.Array
) -> None:
    for t in range(4):

        @pl.when(t < n)
        def _() -> None:
            pltpu.make_async_copy(
                state.at[pl.ds(idx[t], 1)], bufs.at[slot, pl.ds(t, 1)], sems.at[slot]
            ).start()

    rows = bufs.at[slot, pl.ds(0, n)]
    pltpu.make_async_copy(rows, rows, sems.at[slot]).wait()


HOST = pl.BlockSpec(memory_space=pl.HOST)
STATE = pltpu.VMEM((2, 4, 8, 128), jnp.float32)


def histogram_window(
    keys_ref: DataRef,
    values_ref: DataRef | None,
    keys: DataRef,
    values: DataRef,
    histogram: DataRef,
    zeros: DataRef,
    indices: DataRef,
    shared: DataRef,
    sem: SemRef,
    window: jax.Array,
) -> None:
    keys_copy = pltpu.async_copy(keys_ref.at[pl.ds(window * 16, 16)], keys, sem)
    if values_ref is not None:
        vals_copy = pltpu.async_copy(values_ref.at[pl.ds(window * 16, 16)], values, sem)
    else:
        vals_copy = None
    keys_copy.wait()
    del keys_copy
    if vals_copy is not None:
        vals_copy.wait()
    del vals_copy

    @pl.when(window == 1)
    def _() -> None:
        pltpu.async_copy(zeros, shared, sem)

    @pl.when(window == 1)
    def _() -> None:
        pltpu.make_async_copy(zeros, shared, sem).wait()
    # The scatter-add itself, pltpu.sync_copy(histogram, shared.at[indices], add=True), is
    # jax's own unannotated sync_copy, which the stubs pass through: pyright strict reports it
    # partially unknown with and without the stubs.
    del histogram, indices


SPARSE_CORE_SCRATCH = [pltpu.SemaphoreType.DMA, pltpu.VMEM_SHARED((16,), jnp.int32)]
