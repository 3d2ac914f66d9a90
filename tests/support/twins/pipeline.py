"""Hand-written pltpu twin of safedma.kernels.pipeline: same algorithm, same pallas_call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tests.support.twins._ring import hbm_call


def pipeline_kernel(
    x_hbm: Any,
    o_hbm: Any,
    in_bufs: Any,
    out_bufs: Any,
    in_sems: Any,
    out_sems: Any,
    *,
    fn: Callable[[jax.Array], jax.Array],
) -> None:
    chunk_rows = in_bufs.shape[1]
    steps = x_hbm.shape[0] // chunk_rows

    def fetch(step: Any, slot: Any) -> Any:
        return pltpu.make_async_copy(
            x_hbm.at[pl.ds(step * chunk_rows, chunk_rows)], in_bufs.at[slot], in_sems.at[slot]
        )

    def write_back(step: Any, slot: Any) -> Any:
        return pltpu.make_async_copy(
            out_bufs.at[slot], o_hbm.at[pl.ds(step * chunk_rows, chunk_rows)], out_sems.at[slot]
        )

    fetch(0, 0).start()

    def body(step: Any, carry: None) -> None:
        slot = step % 2

        @pl.when(step + 1 < steps)
        def _() -> None:
            fetch(step + 1, 1 - slot).start()

        fetch(step, slot).wait()

        @pl.when(step >= 2)
        def _() -> None:
            write_back(step - 2, slot).wait()

        out_bufs[slot] = fn(in_bufs[slot])
        write_back(step, slot).start()
        return carry

    jax.lax.fori_loop(0, steps, body, None)
    for step in range(max(steps - 2, 0), steps):
        write_back(step, step % 2).wait()


def pipeline(
    x: jax.Array, fn: Callable[[jax.Array], jax.Array], *, chunk_rows: int, interpret: Any = False
) -> jax.Array:
    chunk = (chunk_rows, x.shape[1])
    return hbm_call(
        pipeline_kernel,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[
            pltpu.VMEM((2, *chunk), x.dtype),
            pltpu.VMEM((2, *chunk), x.dtype),
            pltpu.SemaphoreType.DMA((2,)),
            pltpu.SemaphoreType.DMA((2,)),
        ],
        interpret=interpret,
        name="pipeline",
        fn=fn,
    )(x)
