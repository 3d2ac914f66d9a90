"""Gather pages by index (paged-attention style): k page DMAs, one semaphore, one wait.

``gather_pages(pages, indices)`` returns ``pages[indices]``: ``pages`` is a
``(num_pages, page_rows, cols)`` array in HBM and ``indices`` a 1-D int32
array of ``k`` page numbers (repeats allowed, any order). The indices are
scalar-prefetched into SMEM (``pltpu.PrefetchScalarGridSpec``), so the kernel
reads each page number as a scalar and starts that page's DMA directly::

    gathered = gather_pages(kv_pages, page_table)   # (k, page_rows, cols)

Preconditions (checked before tracing, as ``ValueError``):

* ``pages`` is 3-D, float32, int32 (VMEM tile ``(8, 128)``) or bfloat16 (tile
  ``(16, 128)``); ``page_rows`` is a multiple of the tile rows and ``cols`` a
  multiple of 128, so every page lands tile-aligned in VMEM;
* ``indices`` is 1-D int32 with ``k >= 1`` entries;
* when ``indices`` is concrete (not traced under ``jax.jit``), every index is
  in ``[0, num_pages)``.

Out-of-range *traced* indices cannot be checked before the kernel runs, and
the kernel does not check them: on a TPU the result is undefined (the page
DMA addresses memory outside ``pages``); in interpret mode the out-of-bounds
DMA fails the kernel (``safedma.testing.simulate`` raises
``KernelFailedError``). Clamp or validate untrusted indices before the call,
e.g. ``jnp.clip(indices, 0, num_pages - 1)``.

Memory: the ``k`` gathered pages are staged in one VMEM buffer
``(k, page_rows, cols)``, which must fit the chip's scoped VMEM limit
(``compile_for_tpu`` reports an overflow); the indices take ``4 * k`` bytes of
SMEM.

Semaphores: one DMA semaphore, shared by every page copy and then by the
write-back.

DMA flow::

    for j in 0..k-1:  start pages[indices[j]] -> buf[j]   (all on sem, none waited)
    one aggregate wait on sem for buf's full size         (= k pages, the sum)
    start buf -> output; wait

The aggregate wait is ``sd.wait_all_into(buf, sem)``: one wait sized like
``buf``, the sum of the ``k`` copies (it lowers to the idiom of jax's
paged-attention kernel, ``make_async_copy(buf, buf, sem).wait()``), standing
for copies whose handles were not kept.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.kernels._preconditions import LANES, check_tile_dtype
from safedma.kernels._typed_jax import fori_loop

__all__ = ["gather_pages", "gather_pages_kernel"]

_HBM = pl.BlockSpec(memory_space=pl.ANY)


def gather_pages_kernel(
    indices_smem: sd.DataRef,
    pages_hbm: sd.DataRef,
    o_hbm: sd.DataRef,
    buf: sd.DataRef,
    sem: sd.SemRef,
) -> None:
    """The kernel body: ``o_hbm[j] = pages_hbm[indices_smem[j]]`` for every ``j``.

    ``indices_smem`` is the scalar-prefetched int32 ``(k,)`` array in SMEM;
    ``buf`` is VMEM ``(k, page_rows, cols)``; ``sem`` one DMA semaphore.
    """
    k = buf.shape[0]

    def start_page(j: jax.Array, carry: None) -> None:
        sd.LocalCopy(pages_hbm.at[indices_smem[j]], buf.at[j], sem).start()
        return carry

    fori_loop(0, k, start_page, None)
    # One wait for all k page copies: buf's size is the sum of theirs.
    pages = sd.wait_all_into(buf, sem)  # buf, every page landed
    sd.LocalCopy(pages, o_hbm, sem).start().wait()


def _check_static_indices(indices: jax.Array, num_pages: int) -> None:
    try:
        values = np.asarray(indices)
    except jax.errors.TracerArrayConversionError:
        return  # traced: see the module docstring for out-of-range dynamic indices
    bad = np.flatnonzero((values < 0) | (values >= num_pages))
    if bad.size:
        first = int(bad[0])
        raise ValueError(
            f"indices[{first}] = {int(values[first])} is outside [0, {num_pages}) "
            f"({bad.size} of {values.size} indices out of range); pages has "
            f"{num_pages} pages"
        )


def _check(pages: jax.Array, indices: jax.Array) -> None:
    if pages.ndim != 3:
        raise ValueError(f"pages must be 3-D (num_pages, page_rows, cols); got shape {pages.shape}")
    dtype, tile = check_tile_dtype(pages.dtype, "gather_pages")
    num_pages, page_rows, cols = pages.shape
    if page_rows % tile or cols % LANES:
        raise ValueError(
            f"a page ({page_rows}, {cols}) must be a multiple of the VMEM tile "
            f"({tile}, {LANES}) for {dtype.name}"
        )
    if indices.ndim != 1 or indices.shape[0] < 1:
        raise ValueError(f"indices must be 1-D with at least one entry; got shape {indices.shape}")
    if np.dtype(indices.dtype) != np.dtype(np.int32):
        raise ValueError(f"indices must be int32 (they are read from SMEM); got {indices.dtype}")
    _check_static_indices(indices, num_pages)


def gather_pages(
    pages: jax.Array,
    indices: jax.Array,
    *,
    interpret: bool | pltpu.InterpretParams = False,
) -> jax.Array:
    """``pages[indices]``, shape ``(k, page_rows, cols)``, by k DMAs and one aggregate wait.

    Raises ``ValueError`` when a precondition of the module docstring fails.
    """
    _check(pages, indices)
    k = indices.shape[0]
    page = pages.shape[1:]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(),
        in_specs=[_HBM],
        out_specs=_HBM,
        scratch_shapes=[sd.vmem((k, *page), pages.dtype), sd.dma_semaphore()],
    )
    call = sd.pallas_call(
        gather_pages_kernel,
        jax.ShapeDtypeStruct((k, *page), pages.dtype),
        grid_spec=grid_spec,
        interpret=interpret,
        name="gather_pages",
    )
    return call(indices, pages)
