"""Pass: the stubs replace two modules only; jax's own inline types survive everywhere else.

Each ``assert_type`` fails under a checker that lost jax's inline types (for
example pyright with a partial ``jax-stubs`` package on its search path, which
hides jax's own ``.pyi`` files such as ``jax/_src/basearray.pyi``), and the
scratch shapes and pallas_call keep their jax types.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from typing import assert_type

from safedma import DataRef, SemRef


def numpy_and_lax(x: jax.Array) -> None:
    assert_type(jnp.sum(x), jax.Array)
    assert_type(jnp.where(x > 1, x, 0), jax.Array)
    assert_type(jax.lax.axis_index("x"), jax.Array)
    assert_type(jax.lax.axis_size("x"), int)


def pallas_re_exports() -> None:
    assert_type(pl.cdiv(7, 2), int)
    assert_type(pl.program_id(0), jax.Array)
    assert_type(pltpu.CompilerParams(collective_id=0), pltpu.CompilerParams)
    assert_type(pl.BlockSpec(memory_space=pl.ANY), pl.BlockSpec)
    assert_type(pltpu.SemaphoreType.DMA((2,)), pltpu.core.MemoryRef)


def copy_kernel(x_ref: DataRef, o_ref: DataRef, sem: SemRef) -> None:
    pltpu.async_copy(x_ref, o_ref, sem).wait()


def call(x: jax.Array) -> jax.Array:
    any_spec = pl.BlockSpec(memory_space=pl.ANY)
    out: jax.Array = pl.pallas_call(
        copy_kernel,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        in_specs=[any_spec],
        out_specs=any_spec,
        scratch_shapes=[pltpu.SemaphoreType.DMA(())],
        compiler_params=pltpu.CompilerParams(has_side_effects=False),
    )(x)
    return out
