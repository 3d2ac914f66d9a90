"""Hand-written pltpu twin of safedma.kernels.gather: same algorithm, same pallas_call."""

from __future__ import annotations

from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

HBM = pl.BlockSpec(memory_space=pl.ANY)


def gather_pages_kernel(indices_smem: Any, pages_hbm: Any, o_hbm: Any, buf: Any, sem: Any) -> None:
    k = buf.shape[0]

    def body(j: Any, carry: None) -> None:
        pltpu.make_async_copy(pages_hbm.at[indices_smem[j]], buf.at[j], sem).start()
        return carry

    jax.lax.fori_loop(0, k, body, None)
    pltpu.make_async_copy(buf, buf, sem).wait()
    c = pltpu.make_async_copy(buf, o_hbm, sem)
    c.start()
    c.wait()


def gather_pages(pages: jax.Array, indices: jax.Array, *, interpret: Any = False) -> jax.Array:
    k = indices.shape[0]
    page = pages.shape[1:]
    grid_spec = pltpu.PrefetchScalarGridSpec(
        num_scalar_prefetch=1,
        grid=(),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.VMEM((k, *page), pages.dtype), pltpu.SemaphoreType.DMA(())],
    )
    result: jax.Array = pl.pallas_call(
        gather_pages_kernel,
        out_shape=jax.ShapeDtypeStruct((k, *page), pages.dtype),
        grid_spec=grid_spec,
        interpret=interpret,
        name="gather_pages",
    )(indices, pages)
    return result
