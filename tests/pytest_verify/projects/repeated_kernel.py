"""One kernel program run by several tests: verified once per argument types and
control values, its verdict reused for the others."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def dropped_wait_kernel(x_hbm, o_ref, buf, sem):
    pltpu.make_async_copy(x_hbm, buf, sem).start()  # never waited
    o_ref[...] = jnp.zeros_like(o_ref)


@jax.jit
def run(x):
    return pl.pallas_call(
        dropped_wait_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
        interpret=pltpu.InterpretParams(),
    )(x)


@pytest.mark.parametrize("value", [1.0, 2.0, 3.0, 4.0])
def test_same_shape(value):
    jax.block_until_ready(run(jnp.full((8, 128), value)))


def test_other_shape():
    jax.block_until_ready(run(jnp.ones((16, 128))))
