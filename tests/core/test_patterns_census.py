"""The census patterns written with safedma lower to the Mosaic of their raw twins,
on both jax versions, through the kernel-scope checks (sd.pallas_call / checked)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec as P

import safedma as sd
from safedma.testing import abstract_mesh, assert_same_mosaic, mosaic_kernels
from tests.support import census_kernels as ck
from tests.support.twins import census as twin

DEVICES = 4
MESH = abstract_mesh((DEVICES,), (ck.AXIS,))
X_SHARDED = jax.ShapeDtypeStruct(
    (DEVICES * DEVICES * 8, 128), jnp.float32, sharding=NamedSharding(MESH, P(ck.AXIS))
)
X = jax.ShapeDtypeStruct((32, 128), jnp.float32)


def test_moe_all_to_all_shared_semaphore_waited_by_size() -> None:
    ours = ck.moe_call(ck.moe_all_to_all, MESH, sd.pallas_call)
    theirs = ck.moe_call(twin.moe_all_to_all, MESH)
    assert_same_mosaic(ours, theirs, X_SHARDED)


def test_rpa_prefetch_with_2d_semaphores_and_views() -> None:
    steps, num_pages = 3, 16
    ours = ck.rpa_call(ck.rpa_prefetch, steps, num_pages, sd.pallas_call, ck.rpa_scratch())
    theirs = ck.rpa_call(twin.rpa_prefetch, steps, num_pages)
    table = jax.ShapeDtypeStruct((steps * ck.PAGES,), jnp.int32)
    pages = jax.ShapeDtypeStruct((num_pages, ck.PAGE_ROWS, ck.LANES), jnp.float32)
    assert_same_mosaic(ours, theirs, table, pages)


def test_future_start_done_pair() -> None:
    assert_same_mosaic(ck.copy_through_future, twin.copy_through_future, X)


def test_future_chain_is_no_false_alarm() -> None:
    kernels = mosaic_kernels(ck.staggered_futures, X)
    assert len(kernels) == 8  # 4 starts, 4 dones


def test_future_carried_through_a_loop_is_no_false_alarm() -> None:
    @sd.checked_futures
    def looped(x: jax.Array) -> jax.Array:
        first = sd.start_async(ck.future_start, x, dst=jax.ShapeDtypeStruct(x.shape, x.dtype))
        last = jax.lax.fori_loop(0, 3, lambda _, f: ck.future_step(f), first, unroll=2)
        return sd.finish_async(ck.future_done, last)

    count = len(mosaic_kernels(looped, X))
    assert count >= 4 and count % 2 == 0  # starts and dones pair up


def test_emit_pipeline_inside_a_checked_kernel() -> None:
    mesh = abstract_mesh((), (), tpu="v5p")
    ours = ck.pipeline_call(ck.pipelined_scale, [sd.vmem(ck.BLOCK, jnp.float32)], sd.pallas_call)
    theirs = ck.pipeline_call(twin.pipelined_scale, [pltpu.VMEM(ck.BLOCK, jnp.float32)])
    assert_same_mosaic(ours, theirs, X, mesh=mesh)
