"""A dropped wait, run by accident and on purpose, and a program verify does not
check (two shard_maps)."""

import functools

import jax
import pytest
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from safedma.testing import LeftoverSemaphoreError, simulated_mesh


def dropped_wait_kernel(x_hbm, o_ref, buf, sem):
    pltpu.make_async_copy(x_hbm, buf, sem).start()  # never waited
    o_ref[...] = jnp.zeros_like(o_ref)


def copy_kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...]


def call(kernel, x):
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA],
        interpret=pltpu.InterpretParams(),
    )(x)


def test_dropped_wait():
    jax.block_until_ready(jax.jit(functools.partial(call, dropped_wait_kernel))(jnp.ones((8, 128))))


@pytest.mark.safedma_verify_expected(errors=[LeftoverSemaphoreError])
def test_dropped_wait_on_purpose():
    jax.block_until_ready(jax.jit(functools.partial(call, dropped_wait_kernel))(jnp.ones((8, 128))))


@pytest.mark.safedma_verify_expected("DeadlockError")
def test_dropped_wait_expecting_another_mistake():
    jax.block_until_ready(jax.jit(functools.partial(call, dropped_wait_kernel))(jnp.ones((8, 128))))


def test_two_shard_maps_in_one_program():
    mesh = simulated_mesh(2, "x")
    step = jax.shard_map(
        functools.partial(call, copy_kernel),
        mesh=mesh,
        in_specs=P("x"),
        out_specs=P("x"),
        check_vma=False,
    )
    x = jax.device_put(jnp.ones((16, 128)), NamedSharding(mesh, P("x")))
    jax.block_until_ready(jax.jit(lambda x: step(step(x) + 1))(x))
