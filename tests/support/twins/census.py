"""Raw pltpu twins of tests.support.census_kernels: the same kernels as a careful
author writes them without safedma (written for these tests, not copied)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from tests.support.census_kernels import AXIS, LANES, PAGE_ROWS, PAGES, BLOCK

HBM = pl.BlockSpec(memory_space=pl.ANY)
SEM = pl.BlockSpec(memory_space=pltpu.SEMAPHORE)


def moe_all_to_all(x_ref: Any, o_ref: Any, sem: Any) -> None:
    n = jax.lax.axis_size(AXIS)
    me = jax.lax.axis_index(AXIS)
    rows = x_ref.shape[0] // n
    mine = o_ref.at[pl.ds(me * rows, rows)]
    pltpu.make_async_copy(x_ref.at[pl.ds(me * rows, rows)], mine, sem).start()
    for shift in range(1, n):
        peer = (me + shift) % n
        pltpu.make_async_remote_copy(
            x_ref.at[pl.ds(peer * rows, rows)], mine, sem, sem, device_id={AXIS: peer}
        ).start()
    pltpu.make_async_copy(o_ref, o_ref, sem).wait()
    part = o_ref.at[pl.ds(0, (n - 1) * rows)]
    pltpu.make_async_copy(part, part, sem).wait()


def rpa_prefetch(
    table_smem: Any, pages_hbm: Any, o_hbm: Any, buf: Any, sems: Any, out_sem: Any
) -> None:
    step = pl.program_id(0)
    steps = pl.num_programs(0)

    def fetch(s: Any, slot: Any) -> None:
        for p in range(PAGES):
            page = table_smem[s * PAGES + p]
            pltpu.make_async_copy(pages_hbm.at[page], buf.at[slot, p], sems.at[slot, p]).start()

    @pl.when(step == 0)
    def _() -> None:
        fetch(0, 0)

    @pl.when(step + 1 < steps)
    def _() -> None:
        fetch(step + 1, (step + 1) % 2)

    slot = step % 2
    for p in range(PAGES):
        pltpu.make_async_copy(pages_hbm.at[0], buf.at[slot, p], sems.at[slot, p]).wait()
    flat = buf.reshape(2, PAGES * PAGE_ROWS, LANES).at[slot].bitcast(jnp.uint32)
    out = pltpu.make_async_copy(flat, o_hbm.at[step], out_sem)
    out.start()
    out.wait()


def copy_through_future(x: jax.Array) -> jax.Array:
    def start_kernel(x_ref: Any, aliased_x_ref: Any, o_ref: Any, sem: Any) -> None:
        del aliased_x_ref
        pltpu.make_async_copy(x_ref, o_ref, sem).start()

    x, out, sem = pl.pallas_call(
        start_kernel,
        out_shape=(
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            jax.ShapeDtypeStruct(x.shape, x.dtype),
            pltpu.SemaphoreType.DMA(()),
        ),
        in_specs=[HBM],
        out_specs=(HBM, HBM, SEM),
        input_output_aliases={0: 0},
    )(x)

    def done_kernel(x_ref: Any, o_ref: Any, sem: Any, aliased_o_ref: Any) -> None:
        del aliased_o_ref
        pltpu.make_async_copy(x_ref, o_ref, sem).wait()

    result: jax.Array = pl.pallas_call(
        done_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM, HBM, SEM],
        out_specs=HBM,
        input_output_aliases={1: 0},
    )(x, out, sem)
    return result


def _double(x_vmem: Any, o_vmem: Any) -> None:
    o_vmem[...] = x_vmem[...] * 2


def pipelined_scale(x_hbm: Any, o_hbm: Any, buf: Any) -> None:
    spec = pl.BlockSpec(BLOCK, lambda i: (i, 0))
    steps = x_hbm.shape[0] // BLOCK[0]
    pltpu.emit_pipeline(_double, grid=(steps,), in_specs=[spec], out_specs=[spec])(x_hbm, o_hbm)
    pltpu.sync_copy(o_hbm.at[pl.ds(0, BLOCK[0])], buf)
    pltpu.sync_copy(buf, o_hbm.at[pl.ds(0, BLOCK[0])])
