"""A user's kernel tests, as written for a repository with no safedma in its tests:
they run kernels and compare outputs. Copied into a fresh project as
test_user_kernels.py and run with and without --safedma-verify."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import safedma as sd
from safedma.testing import simulate, simulated_mesh

INTERPRET = pltpu.InterpretParams()
X = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
RING = jnp.arange(32 * 128, dtype=jnp.float32).reshape(32, 128)


# ------------------------------------------------------------ raw pltpu kernels


def copy_kernel(x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...] + 1


def dropped_wait_kernel(x_hbm, o_ref, buf, sem):
    pltpu.make_async_copy(x_hbm, buf, sem).start()  # never waited
    o_ref[...] = jnp.zeros_like(o_ref)


def window_kernel(start_ref, x_hbm, o_ref, buf, sem):
    copy = pltpu.make_async_copy(x_hbm.at[pl.ds(start_ref[0], 8)], buf, sem)
    copy.start()
    copy.wait()
    o_ref[...] = buf[...]


def raw_call(kernel, x):
    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), x.dtype), pltpu.SemaphoreType.DMA],
        interpret=INTERPRET,
    )(x)


def window_call(start, x):
    return pl.pallas_call(
        window_kernel,
        out_shape=jax.ShapeDtypeStruct((8, 128), x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
        scratch_shapes=[pltpu.VMEM((8, 128), x.dtype), pltpu.SemaphoreType.DMA],
        interpret=INTERPRET,
    )(start, x)


# ------------------------------------------------------------ safedma kernels


def ring_permute(x_ref, o_ref, send, recv):
    sd.RemoteCopy(x_ref, o_ref, recv).with_send_sem(send).to(sd.neighbour("x")).start().wait()


def forgotten_signal(x_ref, o_ref, send, recv, flag):
    sd.signal(flag, 1)  # never waited: left non-zero on every device
    ring_permute(x_ref, o_ref, send, recv)


RING_SCRATCH = [sd.dma_semaphore(), sd.dma_semaphore()]


def per_device(kernel, scratch, block):
    return sd.pallas_call(
        kernel,
        jax.ShapeDtypeStruct(block.shape, block.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=scratch,
        interpret=INTERPRET,
    )(block)


def on_ring(body):
    mesh = simulated_mesh(4, "x")
    return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False)


def placed(x):
    return jax.device_put(x, NamedSharding(simulated_mesh(4, "x"), P("x")))


@jax.jit
def module_level_program(x):
    return raw_call(dropped_wait_kernel, x)


# ------------------------------------------------------------ tests


def test_raw_kernel_jitted():
    np.testing.assert_array_equal(jax.jit(functools.partial(raw_call, copy_kernel))(X), X + 1)


def test_raw_kernel_eager():
    np.testing.assert_array_equal(raw_call(copy_kernel, X), X + 1)


def test_safedma_kernel_in_shard_map():
    run = jax.jit(on_ring(functools.partial(per_device, ring_permute, RING_SCRATCH)))
    np.testing.assert_array_equal(run(placed(RING)), np.roll(RING, 8, axis=0))


def test_safedma_kernel_under_simulate():
    body = functools.partial(per_device, ring_permute, RING_SCRATCH)
    out = simulate(body, RING, mesh=simulated_mesh(4, "x"))
    np.testing.assert_array_equal(out, np.roll(RING, 8, axis=0))


def test_donated_argument():
    run = jax.jit(functools.partial(raw_call, copy_kernel), donate_argnums=0)
    np.testing.assert_array_equal(run(X + 0), X + 1)


def test_dropped_wait():
    jax.block_until_ready(jax.jit(functools.partial(raw_call, dropped_wait_kernel))(X))


def test_dropped_wait_eager():
    jax.block_until_ready(raw_call(dropped_wait_kernel, X))


def test_forgotten_signal_in_shard_map():
    scratch = [*RING_SCRATCH, sd.regular_semaphore()]
    run = jax.jit(on_ring(functools.partial(per_device, forgotten_signal, scratch)))
    jax.block_until_ready(run(placed(RING)))


def test_window_in_range():
    start = jnp.asarray([8], jnp.int32)
    np.testing.assert_array_equal(jax.jit(window_call)(start, jnp.concatenate([X, X])), X)


def test_window_out_of_range():
    start = jnp.asarray([12], jnp.int32)  # the same program, another start
    jax.block_until_ready(jax.jit(window_call)(start, jnp.concatenate([X, X])))


def test_two_kernels_in_one_program():
    both = jax.jit(lambda x: raw_call(dropped_wait_kernel, raw_call(copy_kernel, x)))
    jax.block_until_ready(both(X))


def test_module_level_program_first():
    jax.block_until_ready(module_level_program(X))


def test_module_level_program_again():
    jax.block_until_ready(module_level_program(X))


def test_two_shard_maps_in_one_program():
    first = on_ring(functools.partial(per_device, ring_permute, RING_SCRATCH))
    second = on_ring(functools.partial(per_device, ring_permute, RING_SCRATCH))
    run = jax.jit(lambda x: second(first(x) * 2))
    np.testing.assert_array_equal(run(placed(RING)), 2 * np.roll(RING, 16, axis=0))


def test_jax_execution_hook_state():
    from jax._src.interpreters import pxla

    hooked = "_execute_hook" in pxla.ExecuteReplicated.__call__.__qualname__
    assert hooked == (os.environ["EXPECT_VERIFY_HOOK"] == "1")
