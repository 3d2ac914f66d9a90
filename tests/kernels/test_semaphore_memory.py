"""What the TPU compiler says about semaphore memory, which the ring kernels' docstrings cite.

``safedma.kernels.all_gather`` explains why its ring uses two receive
semaphores with a capacity handshake rather than one per step (the JAX
guide's design): these compile-only builds are the measurement. One
semaphore per step fits a 256-device ring on v6e and v5p; the limit is the
2 KiB ``sflag`` memory, between 430 and 450 scratch DMA semaphores.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import PartitionSpec as P

from safedma.testing import TpuCompileError, compile_for_tpu

HBM = pl.BlockSpec(memory_space=pl.ANY)
BF16 = jnp.bfloat16


def _one_semaphore_per_step(x: jax.Array, *, axis: str, n: int) -> jax.Array:
    """A ring all-gather with ``n - 1`` receive semaphores and no flow control."""
    b = x.shape[0]

    def kernel(x_ref, o_ref, local_sem, send_sem, recv_sems):  # type: ignore[no-untyped-def]
        me = jax.lax.axis_index(axis)
        own = pltpu.make_async_copy(x_ref, o_ref.at[pl.ds(me * b, b)], local_sem)
        own.start()

        def step(s, carry):  # type: ignore[no-untyped-def]
            chunk = o_ref.at[pl.ds((me - s + n) % n * b, b)]
            copy = pltpu.make_async_remote_copy(
                chunk, chunk, send_sem, recv_sems.at[s], device_id={axis: (me + 1) % n}
            )
            copy.start()
            copy.wait()
            return carry

        own.wait()
        jax.lax.fori_loop(0, n - 1, step, 0)

    result: jax.Array = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((n * b, x.shape[1]), x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA(()),
            pltpu.SemaphoreType.DMA((n - 1,)),
        ],
        name="one_semaphore_per_step",
    )(x)
    return result


def _semaphores(x: jax.Array, *, count: int) -> jax.Array:
    def kernel(x_ref, o_ref, sems):  # type: ignore[no-untyped-def]
        copy = pltpu.make_async_copy(x_ref, o_ref, sems.at[count - 1])
        copy.start()
        copy.wait()

    result: jax.Array = pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[HBM],
        out_specs=HBM,
        scratch_shapes=[pltpu.SemaphoreType.DMA((count,))],
    )(x)
    return result


@pytest.mark.slow
@pytest.mark.parametrize("topology", ["v6e:16x16", "v5p:8x8x4"])
def test_one_semaphore_per_step_fits_a_256_device_ring(topology: str) -> None:
    x = jax.ShapeDtypeStruct((256 * 16, 256), BF16)
    report = compile_for_tpu(
        functools.partial(_one_semaphore_per_step, axis="x", n=256),
        x,
        topology=topology,
        mesh_shape=(256,),
        in_specs=P("x"),
        out_specs=P("x"),
    )
    assert report.kernel_names == ("one_semaphore_per_step",)


@pytest.mark.parametrize("topology", ["v6e:2x2", "v5p:2x2x1"])
def test_semaphore_memory_holds_430_dma_semaphores_not_450(topology: str) -> None:
    x = jax.ShapeDtypeStruct((4 * 16, 256), BF16)
    compile_for_tpu(functools.partial(_semaphores, count=430), x, topology=topology)
    with pytest.raises(TpuCompileError, match="sflag"):
        compile_for_tpu(functools.partial(_semaphores, count=450), x, topology=topology)
