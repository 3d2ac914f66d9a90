"""Kernels run with the sanitizer on: a correct one, one whose unwritten output only
verify sees, and one whose leftover semaphore the sanitizer raises to the test."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

import safedma as sd
from safedma.testing import LeftoverSemaphoreError


def whole_copy(x_hbm, o_hbm, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    pltpu.sync_copy(buf, o_hbm)


def half_written(x_hbm, o_hbm, buf, sem):
    copy = pltpu.make_async_copy(x_hbm, buf, sem)
    copy.start()
    copy.wait()
    pltpu.sync_copy(buf.at[pl.ds(0, 8)], o_hbm.at[pl.ds(0, 8)])  # half of o_hbm


def signal_never_waited(x_hbm, o_hbm, buf, sem, reg):
    whole_copy(x_hbm, o_hbm, buf, sem)
    pl.semaphore_signal(reg, 1)  # never waited


def sanitized(kernel, x, *extra):
    return sd.pallas_call(
        kernel,
        jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[pltpu.VMEM(x.shape, x.dtype), pltpu.SemaphoreType.DMA(()), *extra],
        interpret=pltpu.InterpretParams(),
        sanitize=sd.SanitizeOptions(polls=100),
    )(x)


def test_correct_kernel_sanitized():
    jax.block_until_ready(jax.jit(lambda x: sanitized(whole_copy, x))(jnp.ones((16, 128))))


def test_half_written_output_sanitized():
    jax.block_until_ready(sanitized(half_written, jnp.ones((16, 128))))


def test_leftover_the_sanitizer_raises():
    with pytest.raises(LeftoverSemaphoreError):
        sanitized(signal_never_waited, jnp.ones((16, 128)), pltpu.SemaphoreType.REGULAR)
